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

from ._checks import check_callable, check_positive_int

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
    kron = laplace._kron
    if kron is not None:
        factor = None  # Sigma = Q S^-1 Q^T: J Sigma J^T = W W^T with W = whiten(J)
    else:
        factor = laplace.covariance if laplace.is_diagonal else laplace._scale_tril  # Sigma = diag(v) or L L^T

    def output(latent, inputs):
        return fn(laplace.params(latent), inputs)

    def single(latent, xi):
        return output(latent, xi.unsqueeze(0)).squeeze(0)

    jacobian = torch.func.vmap(torch.func.jacrev(single), in_dims=(None, 0))
    means, covariances = [], []
    with torch.no_grad():
        for start in range(0, x.shape[0], batch_size):
            xb = x[start : start + batch_size]
            mean = output(theta, xb)
            jac = jacobian(theta, xb).reshape(xb.shape[0], -1, theta.shape[0])  # (b, K, d)
            if kron is not None:
                scaled = kron.whiten(jac)
                cov = scaled @ scaled.transpose(-1, -2)
            elif laplace.is_diagonal:
                cov = torch.einsum("bkd,d,bld->bkl", jac, factor, jac)
            else:
                scaled = jac @ factor  # J L
                cov = scaled @ scaled.transpose(-1, -2)
            means.append(mean.detach())
            covariances.append(cov)
    mean, covariance = torch.cat(means), torch.cat(covariances)
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
