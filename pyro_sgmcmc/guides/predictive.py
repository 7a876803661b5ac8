"""The linearised (GLM) predictive of a Laplace approximation.

Linearising the network output :math:`f(x, \\theta)` around the MAP,
:math:`f(x, \\theta) \\approx f(x, \\theta_*) + J(x) (\\theta - \\theta_*)` with
:math:`J(x) = \\partial f(x, \\theta) / \\partial \\theta |_{\\theta_*}`, turns the Gaussian posterior
:math:`\\mathcal N(\\theta_*, \\Sigma)` into a Gaussian over outputs,

.. math:: f(x) \\sim \\mathcal N\\big(f(x, \\theta_*),\\; J(x) \\Sigma J(x)^\\top\\big),

which is usually a better predictive than pushing weight samples through the network (Immer et al.,
2021). For classification the class probabilities :math:`\\mathbb E[\\mathrm{softmax}(f)]` are then
approximated either by the probit approximation (MacKay, 1992)

.. math:: p_k \\approx \\mathrm{softmax}_k\\Big(\\frac{\\mu_k}{\\sqrt{1 + \\frac{\\pi}{8}\\Sigma_{kk}}}\\Big)

(``sigmoid`` instead of ``softmax`` for a single output, a binary logit), or by Monte Carlo
draws of :math:`f` from the Gaussian.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, NamedTuple, Optional, Union

import torch
from torch.distributions import biject_to

from ._checks import check_callable, check_positive_int
from .sites import is_identity_transform

__all__ = ["GLMPrediction", "linearized_predictive"]

_LINKS = (None, "identity", "probit", "mc")


class GLMPrediction(NamedTuple):
    """Mean and covariance of the linearised network output."""

    mean: torch.Tensor  #: ``(n, *out)``, the network output at the MAP
    covariance: torch.Tensor  #: ``(n, K, K)``, ``K = prod(out)``: :math:`J \Sigma J^\top` per input


def linearized_predictive(
    laplace,
    fn: Callable[[Dict[str, torch.Tensor], torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    *,
    link: Optional[str] = None,
    num_samples: int = 1000,
    batch_size: int = 32,
    generator: Optional[torch.Generator] = None,
) -> Union[GLMPrediction, torch.Tensor]:
    """Linearised predictive of ``fn`` under a :class:`~pyro_sgmcmc.guides.LaplaceApproximation`.

    Parameters
    ----------
    laplace : LaplaceApproximation
    fn : callable
        ``fn(params, x) -> output``: the network output for a batch ``x`` (first axis: inputs)
        given the *constrained* site values ``params = {site: value}``, the same values the model
        sees. For a :class:`~pyro.nn.PyroModule` whose weights are ``PyroSample`` sites,
        ``lambda params, x: pyro.poutine.condition(net, data=params)(x)``.
    x : Tensor ``(n, ...)``
        Inputs.
    link : {None, "identity", "probit", "mc"}
        ``None``/``"identity"``: return :class:`GLMPrediction` (regression, or logits).
        ``"probit"`` or ``"mc"``: return class probabilities with the shape of the output, by the
        probit approximation or by ``num_samples`` Monte Carlo draws of the output. A single
        output per input is a binary logit (``sigmoid``); several are multi-class logits
        (``softmax`` over the last axis).
    num_samples : int
        Draws per input for ``link="mc"``.
    batch_size : int
        Inputs per Jacobian computation: memory is ``batch_size * K * d`` numbers.
    generator : torch.Generator, optional
        Random stream for ``link="mc"``.

    Returns
    -------
    GLMPrediction or Tensor

    Examples
    --------
    Bayesian linear regression: the linearisation is exact, and the predictive variance at ``x``
    is :math:`x^\\top \\Sigma x`.

    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_sgmcmc.guides import AutoLaplace
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(0., 1.).expand([2]).to_event(1))
    ...     with pyro.plate("data", len(y)):
    ...         pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)
    >>> x = torch.tensor([[1., 0.], [0., 1.], [1., 1.]]); y = torch.tensor([1., 2., 3.])
    >>> guide = AutoLaplace(model, curvature="full", disable_progbar=True)
    >>> _ = guide(x, y)  # set up; the MAP is known in closed form here:
    >>> guide.loc.data = torch.linalg.solve(x.T @ x / 0.25 + torch.eye(2), x.T @ y / 0.25)
    >>> laplace = guide.laplace_approximation(x, y)
    >>> prediction = laplace.predict(lambda params, x: x @ params["w"], x)
    >>> torch.allclose(prediction.covariance[:, 0, 0], torch.einsum("ni,ij,nj->n", x, laplace.covariance, x))
    True
    """
    if not (link is None or isinstance(link, str)) or link not in _LINKS:
        raise ValueError(f"unknown link {link!r}; accepted: {', '.join(repr(v) for v in _LINKS)}")
    check_positive_int(batch_size, "batch_size")
    check_positive_int(num_samples, "num_samples")
    check_callable(fn, "fn")
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not (x.is_floating_point() or not x.is_complex()):
        raise TypeError(f"x must be a tensor of inputs with a leading batch axis; got {x!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be None or a torch.Generator; got {generator!r}")
    theta = laplace.loc.detach()
    jacobian_batch = _jacobian_path(laplace, fn)
    fast = _LinearLayerPath(laplace, fn) if laplace.posterior_precision.has_layer_factors else None
    means, covariances = [], []
    with torch.no_grad():
        for start in range(0, x.shape[0], batch_size):
            xb = x[start : start + batch_size]
            result = None
            if fast is not None:
                result = fast(theta, xb)
                if result is not None and start == 0 and not _agrees(result, jacobian_batch(theta, xb[:2])):
                    result = None  # examples interact, or a layer is used outside F.linear
                if result is None:
                    fast = None
            if result is None:
                result = jacobian_batch(theta, xb)
            means.append(result[0].detach())
            covariances.append(result[1])
    mean, covariance = torch.cat(means), torch.cat(covariances)
    return _link(mean, covariance, link, num_samples, generator)


def _link(mean, covariance, link, num_samples, generator):
    if link in (None, "identity"):
        return GLMPrediction(mean, covariance)
    out_shape = mean.shape[1:]
    mu = mean.reshape(mean.shape[0], -1)
    binary = mu.shape[1] == 1
    if link == "probit":
        variance = covariance.diagonal(dim1=-2, dim2=-1)
        scaled = mu / torch.sqrt(1 + math.pi / 8 * variance)
        probs = torch.sigmoid(scaled) if binary else torch.softmax(scaled, dim=-1)
        return probs.reshape(mean.shape[0], *out_shape)
    # Monte Carlo: f = mu + C eps with C C^T = covariance (eigen square root: robust to rank deficiency)
    eigenvalues, eigenvectors = torch.linalg.eigh(0.5 * (covariance + covariance.transpose(-1, -2)))
    root = eigenvectors * eigenvalues.clamp(min=0).sqrt().unsqueeze(-2)
    noise = torch.randn((num_samples,) + mu.shape, dtype=mu.dtype, device=mu.device, generator=generator)
    draws = mu + torch.einsum("nkl,snl->snk", root, noise)
    probs = torch.sigmoid(draws) if binary else torch.softmax(draws, dim=-1)
    return probs.mean(0).reshape(mean.shape[0], *out_shape)


# ---------------------------------------------------------------------------------- the Jacobian path
def _jacobian_path(laplace, fn):
    """``(theta, xb) -> (mean, covariance)`` from per-input Jacobians (``vmap(jacrev)``), any network.

    :math:`J \\Sigma J^\\top = W W^\\top` with :math:`W` the precision's whitening of :math:`J`.
    """
    precision = laplace.posterior_precision

    def output(latent, inputs):
        return fn(laplace.params(latent), inputs)

    def single(latent, xi):
        return output(latent, xi.unsqueeze(0)).squeeze(0)

    jacobian = torch.func.vmap(torch.func.jacrev(single), in_dims=(None, 0))

    def batch(theta, xb):
        mean = output(theta, xb)
        jac = jacobian(theta, xb).reshape(xb.shape[0], -1, theta.shape[0])  # (b, K, d)
        scaled = precision.whiten(jac)
        return mean, scaled @ scaled.transpose(-1, -2)

    return batch


def _agrees(fast, reference) -> bool:
    """Do the fast path's first inputs match the Jacobian path (to rounding of the dtype)?"""
    count = reference[1].shape[0]
    tolerance = 1e-4 if reference[1].dtype == torch.float32 else 1e-9
    cov, ref = fast[1][:count], reference[1]
    scale = ref.abs().max().clamp(min=torch.finfo(ref.dtype).tiny)
    return bool(((cov - ref).abs().max() / scale) <= tolerance) and bool(
        torch.allclose(fast[0][:count], reference[0], rtol=tolerance, atol=tolerance * float(scale))
    )


class _LinearLayerPath:
    r"""``J \Sigma J^\top`` for networks of ``F.linear`` layers without forming ``J`` (diagonal and K-FAC).

    For a layer :math:`z = W a + b` the Jacobian of output :math:`k` with respect to ``vec(W)``
    is :math:`\delta_k \otimes a`, :math:`\delta_k = \partial f_k / \partial z` (one batched
    backward pass per output column gives all :math:`\delta_k`). With a diagonal covariance
    :math:`V` (shape of ``W``): :math:`[J V J^\top]_{kl} = \sum_i \delta_{ki}\delta_{li}
    (V a^{\circ 2})_i`; with a K-FAC block :math:`(U_G\otimes U_A) \mathrm{diag}(E)^{-1}
    (U_G\otimes U_A)^\top`: :math:`\sum_i \tilde\delta_{ki}\tilde\delta_{li}
    \sum_j \tilde a_j^2 / E_{ij}`, :math:`\tilde\delta = U_G^\top\delta`, :math:`\tilde a = U_A^\top a`.
    The cost is that of a few backward passes and small matrix products, instead of a
    ``(b, K, d)`` Jacobian. Returns ``None`` where it does not apply (a latent site not the weight
    or bias of exactly one ``F.linear`` call on ``(batch, in)`` inputs, or a constrained site);
    the caller also checks the first inputs against the Jacobian path.
    """

    def __init__(self, laplace, fn):
        self.laplace = laplace
        self.fn = fn
        self.precision = laplace.posterior_precision
        sites = laplace.prototype_trace.iter_stochastic_nodes()
        self.unconstrained = all(is_identity_transform(biject_to(site["fn"].support)) for _, site in sites)

    def __call__(self, theta, xb):
        from .curvature.linear import LinearRecorder

        laplace = self.laplace
        names = list(laplace.site_slices)
        if not self.unconstrained:
            return None  # a constrained site: the layer sees a transform of theta, not theta
        with torch.enable_grad():
            params = laplace.params(theta.detach().requires_grad_(True))
            latent = {name: params[name] for name in names}
            recorder = LinearRecorder({id(value): name for name, value in latent.items()})
            with recorder:
                out = self.fn(params, xb)
            batch = xb.shape[0]
            used = []
            for weight_name, bias_name, inputs, z in recorder.calls:
                if inputs.dim() != 2 or inputs.shape[0] != batch or z.dim() != 2:
                    return None
                used += [n for n in (weight_name, bias_name) if n is not None]
            if sorted(used) != sorted(names) or out.shape[0] != batch:
                return None
            flat = out.reshape(batch, -1)
            num_outputs = flat.shape[1]
            outputs = [z for _, _, _, z in recorder.calls]
            basis = torch.eye(num_outputs, dtype=flat.dtype, device=flat.device)
            cotangents = basis.unsqueeze(1).expand(num_outputs, *flat.shape)
            try:
                deltas = torch.autograd.grad(flat, outputs, grad_outputs=cotangents, is_grads_batched=True,
                                             allow_unused=True)  # fmt: skip
            except RuntimeError:
                return None
        covariance = flat.new_zeros(batch, num_outputs, num_outputs)
        for (weight_name, bias_name, inputs, z), delta in zip(recorder.calls, deltas):
            if delta is None:
                continue
            delta = delta.detach()  # (K, b, out)
            a = inputs.detach()
            if weight_name is not None:
                covariance += _gram(*self.precision.layer_factors(weight_name, delta, a))
            if bias_name is not None:
                covariance += _gram(*self.precision.layer_factors(bias_name, delta, None))
        return out.detach(), covariance


def _gram(delta, weights):
    r""":math:`\sum_i \delta_{kbi}\delta_{lbi} w_{bi}` as ``(b, K, K)``."""
    scaled = delta * weights.sqrt()  # (K, b, out)
    scaled = scaled.permute(1, 0, 2)  # (b, K, out)
    return scaled @ scaled.transpose(-1, -2)

