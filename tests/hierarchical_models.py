"""Simulated hierarchical regressions with an exact reference posterior (for the defaults' statistical tests).

Two models on ``J`` groups and ``N`` data, ``y_i ~ Normal(a[g_i] + b[g_i] x_i, sigma)``, centred:

* ``"intercepts"`` (varying intercepts, one shared slope):
  ``a_j ~ Normal(mu, tau)``, ``mu ~ Normal(0, 5)``, ``tau ~ HalfNormal(2)``, ``b ~ Normal(0, 5)``;
* ``"slopes"`` (varying intercepts and slopes, independent):
  as above, and ``b_j ~ Normal(mu_beta, tau_beta)``, ``mu_beta ~ Normal(0, 5)``, ``tau_beta ~ HalfNormal(2)``;

with ``sigma ~ HalfNormal(2)``. Centred, not non-centred: every group here has hundreds of data, so the data,
not ``tau``, fix each ``a_j``; the centred posterior is then nearly Gaussian and uncorrelated, while the
non-centred one (``a_j = mu + tau a~_j``) ties every ``a~_j`` to ``tau`` along a curved ridge (the reverse of
eight schools, whose groups have one datum each).

The reference is exact up to quadrature, not Monte Carlo. Given the hyper-parameters
:math:`h = (\\tau, [\\tau_\\beta], \\sigma)` the model is linear-Gaussian in
:math:`\\theta = (a, b, \\mu, [\\mu_\\beta])`, with prior precision :math:`Q_0(h)` (mean 0) and design
:math:`\\Phi`, so :math:`\\theta \\mid h, y \\sim N(m, Q^{-1})` with :math:`Q = Q_0 + \\Phi^\\top\\Phi / \\sigma^2`,
:math:`m = Q^{-1}\\Phi^\\top y / \\sigma^2`, and

.. math:: \\log p(y \\mid h) = -N \\log\\sigma - \\frac{y^\\top y}{2\\sigma^2} + \\tfrac12 \\log|Q_0|
          - \\tfrac12 \\log|Q| + \\tfrac12 m^\\top Q m + \\text{const}.

:math:`p(h \\mid y)` is integrated on a product grid in :math:`\\log h` (``GRID_HALF_WIDTH`` Laplace sds either
side of the mode; the weight at the grid's edges is checked to be negligible), and the moments of every
parameter are mixtures over the grid: :math:`E\\theta = \\sum_k w_k m_k`,
:math:`E\\theta^2 = \\sum_k w_k (\\mathrm{diag}\\, Q_k^{-1} + m_k^2)`.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Tuple

import pyro
import pyro.distributions as dist
import torch

__all__ = ["simulate", "build_model", "exact_moments", "site_values"]

DTYPE = torch.float64
PRIOR_SD = 5.0  # of mu, mu_beta and a shared b
SCALE_PRIOR_SD = 2.0  # HalfNormal of tau, tau_beta and sigma
GRID_HALF_WIDTH = 7.0  # Laplace sds of log h either side of the mode
GRID_POINTS = {"intercepts": 61, "slopes": 25}  # per hyper-parameter axis


def simulate(
    kind: str, num_groups: int = 20, num_data: int = 20000, seed: int = 1, smallest_weight: float = 0.2
) -> Dict[str, torch.Tensor]:
    """Data of ``kind`` (``"intercepts"`` or ``"slopes"``): unbalanced groups (weights rising linearly from
    ``smallest_weight`` to ``2 - smallest_weight``; with 0.2 and 20 groups the smallest group has 1 % of the data,
    5 data in a minibatch of 500), ``x ~ N(0, 1)``,
    ``a_j ~ N(1, 0.5)``, ``b_j = 0.7`` (``"slopes"``: ``~ N(0.7, 0.3)``), noise sd 1.5."""
    if kind not in GRID_POINTS:
        raise ValueError(f"kind must be one of {sorted(GRID_POINTS)}; got {kind!r}")
    generator = torch.Generator().manual_seed(seed)
    weights = torch.linspace(smallest_weight, 2 - smallest_weight, num_groups, dtype=DTYPE)
    group = torch.multinomial(weights / weights.sum(), num_data, replacement=True, generator=generator)
    x = torch.randn(num_data, generator=generator, dtype=DTYPE)
    intercept = 1.0 + 0.5 * torch.randn(num_groups, generator=generator, dtype=DTYPE)
    slope = torch.full((num_groups,), 0.7, dtype=DTYPE)
    if kind == "slopes":
        slope = slope + 0.3 * torch.randn(num_groups, generator=generator, dtype=DTYPE)
    y = intercept[group] + slope[group] * x + 1.5 * torch.randn(num_data, generator=generator, dtype=DTYPE)
    return {"kind": kind, "group": group, "x": x, "y": y, "num_groups": num_groups}


def _normal(scale: float):
    return dist.Normal(torch.tensor(0.0, dtype=DTYPE), scale)


def build_model(data: Dict[str, torch.Tensor], subsample_size: int, centred: bool = True) -> Callable[[], None]:
    """The Pyro model of ``data``: every parameter at a global site, the likelihood in ``pyro.plate("data", N,
    subsample_size=subsample_size)``. ``centred=False`` samples ``alpha_raw ~ N(0, 1)`` and puts
    ``alpha = mu + tau alpha_raw`` (a ``pyro.deterministic`` site): the same posterior, badly parametrised for
    data-rich groups (module docstring)."""
    group, x, y, num_groups = data["group"], data["x"], data["y"], data["num_groups"]
    slopes = data["kind"] == "slopes"

    def model() -> None:
        mu = pyro.sample("mu", _normal(PRIOR_SD))
        tau = pyro.sample("tau", dist.HalfNormal(torch.tensor(SCALE_PRIOR_SD, dtype=DTYPE)))
        if centred:
            intercept = pyro.sample("alpha", dist.Normal(mu, tau).expand([num_groups]).to_event(1))
        else:
            raw = pyro.sample("alpha_raw", dist.Normal(torch.zeros(num_groups, dtype=DTYPE), 1.0).to_event(1))
            intercept = pyro.deterministic("alpha", mu + tau * raw)
        if slopes:
            mu_beta = pyro.sample("mu_beta", _normal(PRIOR_SD))
            tau_beta = pyro.sample("tau_beta", dist.HalfNormal(torch.tensor(SCALE_PRIOR_SD, dtype=DTYPE)))
            slope = pyro.sample("beta", dist.Normal(mu_beta, tau_beta).expand([num_groups]).to_event(1))
        else:
            slope = pyro.sample("beta", _normal(PRIOR_SD)).expand([num_groups])
        sigma = pyro.sample("sigma", dist.HalfNormal(torch.tensor(SCALE_PRIOR_SD, dtype=DTYPE)))
        with pyro.plate("data", len(y), subsample_size=subsample_size) as i:
            g = group[i]
            pyro.sample("y", dist.Normal(intercept[g] + slope[g] * x[i], sigma), obs=y[i])

    return model


def site_values(samples: Dict[str, torch.Tensor], kind: str) -> Dict[str, torch.Tensor]:
    """Draws of every scalar parameter of model ``kind``, named as :func:`exact_moments` names them
    (``alpha[3]``, ``tau``, ...), from ``get_samples()`` (any leading axes)."""
    scalars = ["mu", "tau", "sigma"] + (["mu_beta", "tau_beta"] if kind == "slopes" else ["beta"])
    vectors = ["alpha", "beta"] if kind == "slopes" else ["alpha"]
    out = {name: samples[name] for name in scalars}
    for name in vectors:
        for j in range(samples[name].shape[-1]):
            out[f"{name}[{j}]"] = samples[name][..., j]
    return out


def _design(data) -> Tuple[torch.Tensor, list]:
    """:math:`\\Phi` (N x D) and the names of :math:`\\theta`'s coordinates."""
    group, x, num_groups = data["group"], data["x"], data["num_groups"]
    one_hot = torch.nn.functional.one_hot(group, num_groups).to(DTYPE)
    names = [f"alpha[{j}]" for j in range(num_groups)]
    if data["kind"] == "slopes":
        columns = [one_hot, one_hot * x[:, None], torch.zeros(len(x), 2, dtype=DTYPE)]
        names += [f"beta[{j}]" for j in range(num_groups)] + ["mu", "mu_beta"]
    else:
        columns = [one_hot, x[:, None], torch.zeros(len(x), 1, dtype=DTYPE)]
        names += ["beta", "mu"]
    return torch.cat(columns, 1), names


def _prior_precision(data, scales: torch.Tensor) -> torch.Tensor:
    """:math:`Q_0` for each row of ``scales`` = the group sds (``tau`` [, ``tau_beta``]): ``(K, D, D)``."""
    num_groups = data["num_groups"]
    blocks = scales.shape[1]  # group blocks: 1 (intercepts) or 2 (slopes)
    dim = blocks * num_groups + 2
    q = torch.zeros(scales.shape[0], dim, dim, dtype=DTYPE)
    means = [num_groups + 1] if blocks == 1 else [2 * num_groups, 2 * num_groups + 1]
    if blocks == 1:  # the shared slope
        q[:, num_groups, num_groups] = PRIOR_SD**-2
    for block, mean in enumerate(means):
        precision = scales[:, block] ** -2
        rows = torch.arange(block * num_groups, (block + 1) * num_groups)
        q[:, rows, rows] = precision[:, None]
        q[:, rows, mean] = -precision[:, None]
        q[:, mean, rows] = -precision[:, None]
        q[:, mean, mean] = num_groups * precision + PRIOR_SD**-2
    return q


def _conditional(data, stats, log_h: torch.Tensor):
    """For each row of ``log_h`` (``log tau [, log tau_beta], log sigma``): the log density of ``log h`` given
    ``y`` (unnormalised), and the conditional mean and variances of :math:`\\theta`."""
    gram, projection, yy, n = stats
    h = log_h.exp()
    scales, sigma = h[:, :-1], h[:, -1]
    q0 = _prior_precision(data, scales)
    q = q0 + gram / sigma[:, None, None] ** 2
    b = projection / sigma[:, None] ** 2
    chol = torch.linalg.cholesky(q)
    mean = torch.cholesky_solve(b[..., None], chol)[..., 0]
    log_det_q = 2 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    log_det_q0 = 2 * torch.linalg.cholesky(q0).diagonal(dim1=-2, dim2=-1).log().sum(-1)
    log_lik = -n * sigma.log() - yy / (2 * sigma**2) + 0.5 * (log_det_q0 - log_det_q) + 0.5 * (b * mean).sum(-1)
    log_prior = (-0.5 * (h / SCALE_PRIOR_SD) ** 2).sum(-1) + log_h.sum(-1)  # HalfNormal, Jacobian of log
    variances = torch.cholesky_inverse(chol).diagonal(dim1=-2, dim2=-1)
    return log_lik + log_prior, mean, variances


def exact_moments(data: Dict[str, torch.Tensor]) -> Dict[str, Tuple[float, float]]:
    """Posterior ``(mean, sd)`` of every scalar parameter, exact up to quadrature (module docstring)."""
    design, names = _design(data)
    y = data["y"]
    stats = (design.T @ design, design.T @ y, float(y @ y), len(y))
    hyper_names = ["tau", "tau_beta", "sigma"] if data["kind"] == "slopes" else ["tau", "sigma"]

    def log_density(log_h):
        return _conditional(data, stats, log_h[None])[0][0]

    mode = torch.zeros(len(hyper_names), dtype=DTYPE, requires_grad=True)
    optimiser = torch.optim.LBFGS([mode], max_iter=200, line_search_fn="strong_wolfe", tolerance_grad=1e-10)

    def closure():
        optimiser.zero_grad()
        loss = -log_density(mode)
        loss.backward()
        return loss

    optimiser.step(closure)
    mode = mode.detach()
    hessian = torch.autograd.functional.hessian(lambda v: -log_density(v), mode)
    laplace_sd = torch.linalg.inv(hessian).diagonal().sqrt()
    points = GRID_POINTS[data["kind"]]
    unit = torch.linspace(-GRID_HALF_WIDTH, GRID_HALF_WIDTH, points, dtype=DTYPE)
    axes = [m + s * unit for m, s in zip(mode, laplace_sd)]
    grid = torch.cartesian_prod(*axes).reshape(-1, len(axes))
    log_w, means, variances = [], [], []
    for chunk in grid.split(4096):
        lw, m, v = _conditional(data, stats, chunk)
        log_w.append(lw), means.append(m), variances.append(v)
    log_w = torch.cat(log_w)
    weights = (log_w - log_w.max()).exp()
    weights = weights / weights.sum()
    edge = torch.zeros(len(grid), dtype=torch.bool)
    for k, axis in enumerate(axes):
        edge |= (grid[:, k] == axis[0]) | (grid[:, k] == axis[-1])
    if float(weights[edge].sum()) > 1e-6:
        raise RuntimeError("the quadrature grid is too narrow: weight at its edges")
    mean = weights @ torch.cat(means)
    second = weights @ (torch.cat(variances) + torch.cat(means) ** 2)
    out = {name: (float(mean[k]), float((second[k] - mean[k] ** 2).sqrt())) for k, name in enumerate(names)}
    h = grid.exp()
    for k, name in enumerate(hyper_names):
        m = float(weights @ h[:, k])
        out[name] = (m, math.sqrt(float(weights @ h[:, k] ** 2) - m * m))
    return out
