r"""Laplace over chosen parameters of a plain ``torch.nn.Module`` (LoRA adapters, a last layer), from its MAP.

The module is whatever the user trained (a classifier wrapped by PEFT's LoRA, a network with a
head), not a Pyro model: the chosen parameters :math:`\theta` (``nn.Linear`` weights and biases)
are the latent variables, every other parameter stays fixed and untouched, and their current
values are the MAP :math:`\theta_*` (no refit). With a Gaussian prior
:math:`\mathcal N(0, \mathrm{diag}(\lambda)^{-1})` the posterior is approximated by
:math:`\mathcal N(\theta_*, \Lambda^{-1})`, :math:`\Lambda = H + \mathrm{diag}(\lambda)`, with the
generalised Gauss-Newton matrix of the negative log-likelihood

.. math:: H = \sum_n J_n^\top F(f_n) J_n, \qquad J_n = \partial f(x_n, \theta) / \partial\theta,

:math:`f_n` the logits (:math:`F = \mathrm{diag}(p) - pp^\top`, ``"classification"``) or the outputs
(:math:`F = I/\sigma^2`, ``"regression"``). ``curvature`` chooses how :math:`H` is stored:
``"diag_ggn"`` its diagonal, ``"kron"`` one K-FAC block :math:`G \otimes A` per parameter
(:mod:`~pyro_sgmcmc.guides.module_taps`; with ``kron_rank`` the large factors keep their top
eigenpairs, :mod:`~pyro_sgmcmc.guides.lowrank_kron`) and ``"full_ggn"`` all of it (a last layer).

Usage::

    laplace = ModuleLaplace(model, parameters=is_lora_parameter, curvature="kron", kron_rank=16)
    laplace.fit(train_loader)                  # batches (inputs, labels); inputs a tensor or a dict
    laplace.optimize_prior_precision()         # the evidence at the fixed MAP
    probs = laplace.predict(test_inputs, link="probit")

Peak memory is stated and bounded by :mod:`~pyro_sgmcmc.guides.module_memory` (``max_memory``).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ._checks import check_positive_int
from .curvature.kinds import MAX_FULL_DIM, Curvature
from .curvature.rows import exact_fisher_rows
from .evidence import check_bounds, maximise_log_evidence, standard_log_evidence
from .lowrank_kron import LowRankKronPrecision
from .module_memory import check_memory, fit_numbers, predict_numbers
from .module_taps import LinearTaps, kfac_factors, output_gradients, per_example_jacobian
from .precision import DensePrecision, DiagPrecision, Precision
from .predictive import GLMPrediction

__all__ = ["ModuleLaplace", "is_lora_parameter", "default_output"]

Inputs = Union[torch.Tensor, Mapping[str, torch.Tensor]]
_CURVATURES = (Curvature.DIAG_GGN, Curvature.KRON, Curvature.FULL_GGN)


def is_lora_parameter(name: str, parameter: torch.Tensor) -> bool:
    """PEFT's naming: the weights of ``lora_A`` and ``lora_B`` layers (``...lora_A.default.weight``)."""
    return "lora_A" in name or "lora_B" in name


def default_output(module: nn.Module, inputs: Inputs) -> torch.Tensor:
    """``module(**inputs)`` for a dict (token ids, attention masks), else ``module(inputs)``; a result
    with a ``logits`` attribute (a ``transformers`` output) gives its logits."""
    out = module(**inputs) if isinstance(inputs, Mapping) else module(inputs)
    return getattr(out, "logits", out)


def _chunks(inputs: Inputs, batch_size: int) -> Iterable[Inputs]:
    size = next(iter(inputs.values())).shape[0] if isinstance(inputs, Mapping) else inputs.shape[0]
    for start in range(0, size, batch_size):
        if isinstance(inputs, Mapping):
            yield {key: value[start : start + batch_size] for key, value in inputs.items()}
        else:
            yield inputs[start : start + batch_size]


class ModuleLaplace:
    r"""Laplace approximation over chosen ``nn.Linear`` parameters of a trained ``nn.Module``.

    Parameters
    ----------
    module : nn.Module
        The trained network; its forward pass must treat the examples of a batch independently
        (it is put in ``eval()`` mode while fitting and predicting, then restored).
    parameters : sequence of str or callable
        The latent parameters: names from ``module.named_parameters()``, or a predicate
        ``(name, parameter) -> bool`` such as :func:`is_lora_parameter`. Each must be the weight
        or bias of an ``nn.Linear``.
    likelihood : {"classification", "regression"}
        Categorical over the logits, or :math:`\mathcal N(f, \sigma^2)` with ``sigma_noise`` :math:`\sigma`.
    curvature : {"kron", "diag_ggn", "full_ggn"}
        How :math:`H` is represented (``"full_ggn"``: at most ``MAX_FULL_DIM`` weights).
    kron_rank : int, optional
        ``"kron"`` only: every Kronecker factor larger than this keeps its top ``kron_rank``
        eigenpairs (Laplace-LoRA); ``None`` keeps all.
    kfac : {"expand", "reduce"}
        ``"kron"`` only: how positions (tokens) of one example enter the factors
        (:func:`~pyro_sgmcmc.guides.module_taps.kfac_factors`); identical without a sequence axis.
    position_mask : str, optional
        ``"kron"`` only: the key of the dict inputs holding a ``(b, T)`` mask (``"attention_mask"``)
        whose zero positions (padding) are left out of the input factors :math:`A` of the layers
        called over ``T`` positions; ``None`` counts every position.
    sigma_noise : float
        ``"regression"`` only: the fixed noise scale :math:`\sigma`.
    output_fn : callable, optional
        ``(module, inputs) -> (b, K)`` outputs; default :func:`default_output`.
    max_memory : int, optional
        Bytes a step may use beyond the module's activations (:mod:`.module_memory`); a larger
        step raises a ``ValueError`` naming its size before it allocates.

    Examples
    --------
    The last layer of a small classifier, with two batches of (inputs, labels):

    >>> import torch
    >>> from torch import nn
    >>> from pyro_sgmcmc.guides import ModuleLaplace
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    >>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    >>> laplace = ModuleLaplace(net, ["2.weight", "2.bias"], curvature="full_ggn")
    >>> laplace = laplace.fit([(x[:32], y[:32]), (x[32:], y[32:])])
    >>> prior = laplace.optimize_prior_precision()
    >>> prediction = laplace.predict(x[:5])
    >>> prediction.mean.shape, prediction.covariance.shape
    (torch.Size([5, 3]), torch.Size([5, 3, 3]))
    """

    def __init__(self, module: nn.Module, parameters: Union[Sequence[str], Callable[[str, torch.Tensor], bool]], *,
                 likelihood: str = "classification", curvature: str = "kron", kron_rank: Optional[int] = None,
                 kfac: str = "expand", position_mask: Optional[str] = None, sigma_noise: float = 1.0,
                 output_fn: Optional[Callable] = None, max_memory: Optional[int] = None) -> None:  # fmt: skip
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module; got {type(module).__name__}")
        if callable(parameters):
            names = [name for name, p in module.named_parameters() if parameters(name, p)]
        elif isinstance(parameters, str) or not isinstance(parameters, Sequence):
            raise TypeError(f"parameters must be a sequence of parameter names or a predicate; got {parameters!r}")
        else:
            names = list(parameters)
        if not names:
            raise ValueError("parameters selects no parameter of the module")
        if len(set(names)) != len(names):
            raise ValueError(f"parameters names a parameter twice: {names}")
        if likelihood not in ("classification", "regression"):
            raise ValueError(f"likelihood must be 'classification' or 'regression'; got {likelihood!r}")
        self.curvature = Curvature.parse(curvature)
        if self.curvature not in _CURVATURES:
            raise ValueError(f"curvature must be one of {[c.value for c in _CURVATURES]}; got {curvature!r}")
        if kron_rank is not None:
            check_positive_int(kron_rank, "kron_rank")
        if kfac not in ("expand", "reduce"):
            raise ValueError(f"kfac must be 'expand' or 'reduce'; got {kfac!r}")
        if position_mask is not None and not isinstance(position_mask, str):
            raise TypeError(
                f"position_mask must be None or the key of a mask in the dict inputs; got {position_mask!r}"
            )
        self.position_mask = position_mask
        if not (isinstance(sigma_noise, (int, float)) and math.isfinite(sigma_noise) and sigma_noise > 0):
            raise ValueError(f"sigma_noise must be a positive finite number; got {sigma_noise!r}")
        if max_memory is not None:
            check_positive_int(max_memory, "max_memory")
        self.module, self.likelihood, self.kron_rank, self.kfac = module, likelihood, kron_rank, kfac
        self.sigma_noise, self.max_memory = float(sigma_noise), max_memory
        self.output_fn = default_output if output_fn is None else output_fn
        self.taps = LinearTaps(module, names)
        self.names = names
        params = self.taps.parameters
        self.shapes = {name: tuple(params[name].shape) for name in names}
        self.slices, offset = {}, 0
        for name in names:
            self.slices[name] = slice(offset, offset + params[name].numel())
            offset += params[name].numel()
        if self.curvature is Curvature.FULL_GGN and offset > MAX_FULL_DIM:
            raise ValueError(f"curvature='full_ggn' is limited to {MAX_FULL_DIM} weights; {offset} are chosen")
        self.loc = torch.cat([params[name].detach().reshape(-1) for name in names]).clone()
        self.precision: Optional[Precision] = None
        self.posterior_precision: Optional[Precision] = None

    # ------------------------------------------------------------------ the likelihood
    def _rows(self, outputs: torch.Tensor) -> torch.Tensor:
        """Whitened outputs with :math:`\\sum_k \\nabla r_k \\nabla r_k^\\top = J^\\top F J` (``(b, K)``)."""
        if self.likelihood == "regression":
            return outputs / self.sigma_noise
        return exact_fisher_rows(torch.distributions.Categorical(logits=outputs), keep_scale=False)

    def _log_likelihood(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.likelihood == "regression":
            return torch.distributions.Normal(outputs, self.sigma_noise).log_prob(targets.reshape(outputs.shape)).sum()
        return torch.distributions.Categorical(logits=outputs).log_prob(targets).sum()

    def _outputs(self, inputs: Inputs) -> torch.Tensor:
        outputs = self.output_fn(self.module, inputs)
        if outputs.dim() == 1:
            outputs = outputs.unsqueeze(-1)
        if outputs.dim() != 2:
            raise ValueError(f"the module's output must be (batch, K) or (batch,); got shape {tuple(outputs.shape)}")
        if self.likelihood == "classification" and outputs.shape[1] < 2:
            raise ValueError("likelihood='classification' needs K >= 2 logits per example (softmax over classes)")
        return outputs

    def _mask(self, inputs: Inputs) -> Optional[torch.Tensor]:
        if self.position_mask is None:
            return None
        if not isinstance(inputs, Mapping) or self.position_mask not in inputs:
            raise ValueError(f"position_mask={self.position_mask!r} is not a key of the inputs")
        return inputs[self.position_mask]

    def _layer_sizes(self, batch: int):
        sizes = []
        for record in self.taps.layers.values():
            if record.inputs and any(x.shape[0] != batch for x in record.inputs):
                raise ValueError(
                    f"a chosen layer saw inputs with a leading axis other than the batch ({batch}): the examples of "
                    "a batch must stay on the first axis of every adapted nn.Linear's input"
                )
            positions = sum(x.shape[1] for x in record.inputs)
            out = record.outputs[0].shape[-1] if record.outputs else 0
            inp = record.inputs[0].shape[-1] if record.inputs else 0
            count = sum(self.shapes[n][0] * (self.shapes[n][1] if len(self.shapes[n]) == 2 else 1)
                        for n in (record.weight, record.bias) if n is not None)  # fmt: skip
            sizes.append((positions, out, inp, count))
        return sizes

    # ------------------------------------------------------------------ fit
    def fit(self, loader: Iterable) -> "ModuleLaplace":
        """Accumulate the curvature and :math:`\\log p(y \\mid \\theta_*)` over ``loader``'s ``(inputs, targets)``."""
        kind = self.curvature
        d = self.loc.shape[0]
        diag = full = None
        sums: Dict[str, list] = {}
        log_likelihood, count = 0.0, 0
        training = self.module.training
        self.module.eval()
        try:
            for inputs, targets in loader:
                with self.taps, torch.enable_grad():
                    outputs = self._outputs(inputs)
                    batch, num_outputs = outputs.shape
                    numbers = fit_numbers(kind.value, batch, num_outputs, self._layer_sizes(batch))
                    check_memory(f"fitting curvature={kind.value!r}", numbers, outputs.element_size(),
                                 self.max_memory, batch)  # fmt: skip
                    log_likelihood += float(self._log_likelihood(outputs.detach(), targets))
                    count += batch
                    deltas = output_gradients(self.taps, self._rows(outputs))
                    unused = [p for p in self.taps.layers if p not in deltas]
                    if unused:
                        raise ValueError(f"parameters: the layers {unused} were not called by the module's forward "
                                         "pass, so the data say nothing about their parameters")  # fmt: skip
                    jacobians = []
                    for path, record in self.taps.layers.items():
                        if kind is Curvature.KRON:
                            mask = self._mask(inputs)
                            for name, parts in kfac_factors(record, deltas[path], self.kfac, mask).items():
                                old = sums.get(name)
                                sums[name] = list(parts) if old is None else [a + b for a, b in zip(old, parts)]
                            continue
                        for name, jac in per_example_jacobian(record, deltas[path]).items():
                            if kind is Curvature.DIAG_GGN:
                                diag = torch.zeros(d, dtype=jac.dtype, device=jac.device) if diag is None else diag
                                diag[self.slices[name]] += jac.pow(2).sum((0, 1)).reshape(-1)
                            else:
                                jacobians.append((name, jac.reshape(jac.shape[0] * batch, -1)))
                    if kind is Curvature.FULL_GGN:
                        stacked = torch.cat([j for _, j in sorted(jacobians, key=lambda p: self.slices[p[0]].start)], 1)
                        full = stacked.T @ stacked if full is None else full + stacked.T @ stacked
                    self.taps.clear()
        finally:
            self.module.train(training)
        if count == 0:
            raise ValueError("loader gave no batch")
        if kind is Curvature.DIAG_GGN:
            self.precision = DiagPrecision(diag, self.slices)
        elif kind is Curvature.FULL_GGN:
            self.precision = DensePrecision(0.5 * (full + full.T), self.slices)
        else:
            factors = {name: (parts[0], parts[1] / parts[2]) if len(parts) == 3 else (parts[0],)
                       for name, parts in sums.items()}  # fmt: skip
            self.precision = LowRankKronPrecision(factors, self.slices, rank=self.kron_rank)
        self.num_data = count
        self.log_likelihood = torch.tensor(log_likelihood, dtype=torch.float64)
        self._evidence_precision = self.precision.double()
        self.set_prior_precision(1.0)
        return self

    # ------------------------------------------------------------------ prior precision and evidence
    def _prior_vector(self, prior_precision, dtype=torch.float64) -> torch.Tensor:
        """``(d,)`` prior precisions from a number, a ``(num_parameters,)`` tensor or ``{name: number}``."""
        d, device = self.loc.shape[0], self.loc.device
        if isinstance(prior_precision, Mapping):
            unknown = set(prior_precision) - set(self.names)
            if unknown:
                raise ValueError(f"prior_precision names unknown parameters {sorted(unknown)}")
            values = [torch.as_tensor(prior_precision.get(n, 1.0), dtype=dtype, device=device) for n in self.names]
            prior_precision = torch.stack(values)
        value = torch.as_tensor(prior_precision, dtype=dtype, device=device)
        if value.dim() == 0:
            value = value.expand(d)
        elif value.shape == (len(self.names),):
            value = torch.cat([value[i].expand(w.stop - w.start) for i, w in enumerate(self.slices.values())])
        elif value.shape != (d,):
            raise ValueError(f"prior_precision must be a number, one per parameter ({len(self.names)}) or {{name: "
                             f"number}}; got shape {tuple(value.shape)}")  # fmt: skip
        if not bool(torch.isfinite(value).all() and (value > 0).all()):
            raise ValueError("prior_precision must be positive and finite")
        return value

    def _require_fit(self) -> None:
        if self.precision is None:
            raise RuntimeError("call fit(loader) first")

    def set_prior_precision(self, prior_precision) -> None:
        """Use :math:`\\Lambda = H + \\mathrm{diag}(\\lambda)` (a number, one per parameter, or a dict)."""
        self._require_fit()
        vector = self._prior_vector(prior_precision)
        posterior = self.precision.with_prior(vector.to(self.loc.dtype))
        posterior.check()
        self.prior_precision = vector
        self.posterior_precision = posterior

    def log_marginal_likelihood(self, prior_precision=None) -> torch.Tensor:
        r"""The standard Laplace evidence at the fixed MAP, float64 (differentiable in a tensor prior):

        .. math::
            \log p(y\mid\lambda) \approx \log p(y\mid\theta_*) - \tfrac12 \theta_*^\top \mathrm{diag}(\lambda)\theta_*
            + \tfrac12 \log\det\mathrm{diag}(\lambda) - \tfrac12\log\det(H + \mathrm{diag}(\lambda)).
        """
        self._require_fit()
        vector = self.prior_precision if prior_precision is None else self._prior_vector(prior_precision)
        logdet = self._evidence_precision.with_prior(vector).logdet()
        return standard_log_evidence(self.log_likelihood, self.loc.double(), vector, logdet)

    def optimize_prior_precision(self, mode: str = "scalar", bounds=(1e-6, 1e6), max_iter: int = 100):
        """Maximise the evidence over one precision (``mode="scalar"``) or one per parameter tensor
        (``"parameter"``, i.e. per adapter matrix) by L-BFGS in :math:`\\log\\lambda` (the evidence is
        concave there); sets and returns the optimum."""
        self._require_fit()
        if mode not in ("scalar", "parameter"):
            raise ValueError(f"mode must be 'scalar' or 'parameter'; got {mode!r}")
        low, high = check_bounds(bounds)
        check_positive_int(max_iter, "max_iter")
        size = 1 if mode == "scalar" else len(self.names)
        start = torch.ones(size, dtype=torch.float64)
        labels = ["all parameters"] if mode == "scalar" else list(self.names)
        optimum = maximise_log_evidence(lambda v: self.log_marginal_likelihood(v[0] if size == 1 else v),
                                        start.clamp(low, high), (low, high), max_iter, labels)  # fmt: skip
        result = optimum[0] if size == 1 else optimum
        self.set_prior_precision(result)
        return result

    # ------------------------------------------------------------------ the linearised predictive
    def predict(self, inputs: Inputs, *, link: Optional[str] = None, batch_size: int = 32,
                num_samples: int = 1000, generator: Optional[torch.Generator] = None):  # fmt: skip
        r"""The linearised predictive :math:`f(x) \sim \mathcal N(f(x, \theta_*), J(x)\Lambda^{-1}J(x)^\top)`.

        ``inputs`` (a tensor or a dict of tensors sharing the first axis) is walked ``batch_size``
        examples at a time. ``link=None`` returns :class:`~pyro_sgmcmc.guides.predictive.GLMPrediction`
        (means ``(n, K)``, covariances ``(n, K, K)``); ``"probit"`` the class probabilities
        :math:`\mathrm{softmax}(\mu / \sqrt{1 + \frac\pi8 \mathrm{diag}\,\Sigma})` (MacKay's probit
        approximation, elementwise); ``"mc"`` their average over ``num_samples`` Gaussian draws of the logits.
        """
        self._require_fit()
        if link not in (None, "probit", "mc"):
            raise ValueError(f"link must be None, 'probit' or 'mc'; got {link!r}")
        if link is not None and self.likelihood != "classification":
            raise ValueError(f"link={link!r} gives class probabilities: it needs likelihood='classification'")
        check_positive_int(batch_size, "batch_size")
        precision = self.posterior_precision
        means, covariances = [], []
        training = self.module.training
        self.module.eval()
        try:
            for chunk in _chunks(inputs, batch_size):
                with self.taps, torch.enable_grad():
                    outputs = self._outputs(chunk)
                    batch, num_outputs = outputs.shape
                    numbers = predict_numbers(batch, num_outputs, self._layer_sizes(batch))
                    check_memory("the linearised predictive", numbers, outputs.element_size(), self.max_memory, batch)
                    deltas = output_gradients(self.taps, outputs)
                    jacobian = outputs.new_zeros(batch, num_outputs, self.loc.shape[0])
                    for path, record in self.taps.layers.items():
                        for name, jac in per_example_jacobian(record, deltas[path]).items():
                            jacobian[:, :, self.slices[name]] = jac.reshape(num_outputs, batch, -1).transpose(0, 1)
                    self.taps.clear()
                root = precision.whiten(jacobian)
                means.append(outputs.detach())
                covariances.append(root @ root.transpose(-1, -2))
        finally:
            self.module.train(training)
        mean, covariance = torch.cat(means), torch.cat(covariances)
        if link is None:
            return GLMPrediction(mean, covariance)
        if link == "probit":
            scaled = mean / torch.sqrt(1 + math.pi / 8 * covariance.diagonal(dim1=-2, dim2=-1))
            return torch.softmax(scaled, -1)
        check_positive_int(num_samples, "num_samples")
        values, vectors = torch.linalg.eigh(covariance)
        root = vectors * values.clamp(min=0).sqrt().unsqueeze(-2)
        noise = torch.randn((num_samples,) + mean.shape, dtype=mean.dtype, device=mean.device, generator=generator)
        draws = mean + torch.einsum("nkl,snl->snk", root, noise)
        return torch.softmax(draws, -1).mean(0)
