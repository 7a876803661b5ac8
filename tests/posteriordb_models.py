"""Pyro versions of a few posteriordb posteriors, for ``tests/test_posteriordb.py``.

The reference posteriors live outside the repository, in ``../shared/reference/posteriordb``
(see its ``README.md``). Each builder here reads one folder's ``data.json`` and returns a
:class:`Problem`: the Pyro model (with its observations in a ``pyro.plate("data", N,
subsample_size=B)``), a starting point computed from the data, and the map from the sampled
sites to the parameters that ``reference.json`` describes.

Exact linear reparametrisations
-------------------------------
With one scalar step size, a stochastic-gradient sampler needs the posterior to be roughly
isotropic in the sampled coordinates. Two of the posteriors are sampled in linearly
transformed coordinates; the transformation is exact (the prior is pushed forward through it),
so the posterior of the reported parameters is unchanged and the reference still applies.

* Linear regressions (``sblri-blr``, ``earnings-logearn_interaction_z``): ``beta = M u`` with
  ``M = sqrt(N) L^{-T}`` and ``X^T X = L L^T`` (Cholesky). ``M`` uses the design matrix only,
  never ``y`` or the reference; it makes the columns of ``X M`` orthogonal with squared norm ``N``,
  so at fixed ``sigma`` the normalised curvature of ``u`` is ``I / sigma^2``. A Normal(0, s)
  prior on each ``beta`` becomes ``u ~ MultivariateNormal(0, precision = M^T M / s^2)``
  (the density of ``beta`` at ``M u`` up to the constant ``|det M|``); a flat prior stays flat.
* Eight schools: ``mu = 5 mu_raw`` with ``mu_raw ~ Normal(0, 1)``, the exact rescaling by the
  prior scale, which is the same model as ``mu ~ Normal(0, 5)``.

Starting points are computed from the data: the least-squares fit (``beta``, and ``sigma`` from
its residuals) for the regressions; for eight schools, ``mu`` at the precision-weighted mean of
``y``, ``tau = 1`` and ``theta_trans = 0``. None of them uses ``reference.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.distributions import constraints

__all__ = [
    "POSTERIORDB",
    "Problem",
    "load_reference",
    "sblr",
    "earnings_logearn_interaction_z",
    "eight_schools_noncentered",
    "BUILDERS",
]

#: ``../shared/reference/posteriordb`` beside the repository.
POSTERIORDB = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "posteriordb"

DTYPE = torch.float64


def _read(folder: str, name: str) -> dict:
    with open(POSTERIORDB / folder / name) as f:
        return json.load(f)


def load_reference(folder: str) -> Dict[str, dict]:
    """``reference.json``'s ``params``: parameter name (Stan style, ``beta[1]``) -> statistics."""
    params = _read(folder, "reference.json")["params"]
    return dict(params) if isinstance(params, dict) else {name: stats for name, stats in params}


@dataclass
class Problem:
    """One posterior, ready for ``pyro.infer.MCMC``.

    ``model(subsample_size)`` is the Pyro model (``subsample_size=None``: full batch);
    ``init_values`` are constrained starting values for ``init_to_value``; ``to_reference`` maps
    ``MCMC.get_samples()`` (constrained sampled sites, any leading batch shape) to
    ``{reference name: tensor}``; ``obs_site`` is the observed site whose per-datum log
    likelihood gives the gradient noise; ``positive_sites`` are the sampled sites constrained > 0.
    """

    folder: str
    model: Callable
    num_data: int
    init_values: Dict[str, torch.Tensor]
    to_reference: Callable[[Dict[str, torch.Tensor]], Dict[str, torch.Tensor]]
    obs_site: str = "y"
    positive_sites: tuple = ()
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def per_datum_log_likelihood(self, constrained: Dict[str, torch.Tensor]) -> torch.Tensor:
        """The ``N`` log-likelihood terms of the full data at the given (constrained) site values."""
        trace = poutine.trace(poutine.condition(self.model, data=constrained)).get_trace(None)
        site = trace.nodes[self.obs_site]
        return site["fn"].log_prob(site["value"])


# ---------------------------------------------------------------------------- regressions
def _whitening(X: torch.Tensor) -> torch.Tensor:
    """``M = sqrt(N) L^{-T}`` with ``X^T X = L L^T``: from the design matrix alone."""
    n = X.shape[0]
    L = torch.linalg.cholesky(X.T @ X)
    eye = torch.eye(X.shape[1], dtype=X.dtype)
    return math.sqrt(n) * torch.linalg.solve_triangular(L.T, eye, upper=True)


def _regression(
    folder: str,
    X: torch.Tensor,
    y: torch.Tensor,
    beta_prior_scale: Optional[float],
    sigma_prior: Optional[dist.Distribution],
    subsample_size: Optional[int],
    notes: str,
) -> Problem:
    n, d = X.shape
    M = _whitening(X)
    if beta_prior_scale is None:
        u_prior = dist.ImproperUniform(constraints.real, (), (d,))
    else:
        # beta ~ Normal(0, s) elementwise, pushed forward through beta = M u.
        u_prior = dist.MultivariateNormal(torch.zeros(d, dtype=DTYPE), precision_matrix=M.T @ M / beta_prior_scale**2)
    if sigma_prior is None:
        sigma_prior = dist.ImproperUniform(constraints.positive, (), ())

    def model(subsample_size=subsample_size):
        u = pyro.sample("u", u_prior)
        beta = M @ u
        sigma = pyro.sample("sigma", sigma_prior)
        with pyro.plate("data", n, subsample_size=subsample_size) as idx:
            pyro.sample("y", dist.Normal(X[idx] @ beta, sigma), obs=y[idx])

    beta_ls = torch.linalg.lstsq(X, y.unsqueeze(-1)).solution.squeeze(-1)
    residual_sd = ((y - X @ beta_ls).pow(2).sum() / (n - d)).sqrt()
    init = {"u": torch.linalg.solve(M, beta_ls), "sigma": residual_sd}

    def to_reference(samples):
        beta = samples["u"] @ M.T
        out = {f"beta[{j + 1}]": beta[..., j] for j in range(d)}
        out["sigma"] = samples["sigma"]
        return out

    return Problem(
        folder=folder,
        model=model,
        num_data=n,
        init_values=init,
        to_reference=to_reference,
        positive_sites=("sigma",),
        notes=notes,
        extra={"M": M, "beta_ls": beta_ls, "X": X, "y": y},
    )


def sblr(folder: str = "sblri-blr", subsample_size: Optional[int] = 50) -> Problem:
    """``y ~ Normal(X beta, sigma)``, ``beta_j ~ Normal(0, 10)``, ``sigma ~ HalfNormal(10)``; N = 100, X is N x 5."""
    data = _read(folder, "data.json")
    X = torch.tensor(data["X"], dtype=DTYPE)
    y = torch.tensor(data["y"], dtype=DTYPE)
    return _regression(
        folder,
        X,
        y,
        10.0,
        dist.HalfNormal(torch.tensor(10.0, dtype=DTYPE)),
        subsample_size,
        "beta = M u (whitening by the design matrix); start at least squares",
    )


def earnings_logearn_interaction_z(subsample_size: Optional[int] = 100) -> Problem:
    """``log(earn) ~ Normal(b1 + b2 z + b3 male + b4 z male, sigma)``, b and sigma flat; N = 1192.

    ``z`` is height standardised with the sample sd (N - 1 denominator).
    """
    folder = "earnings-logearn_interaction_z"
    data = _read(folder, "data.json")
    earn = torch.tensor(data["earn"], dtype=DTYPE)
    height = torch.tensor(data["height"], dtype=DTYPE)
    male = torch.tensor(data["male"], dtype=DTYPE)
    z = (height - height.mean()) / height.std(unbiased=True)
    X = torch.stack([torch.ones_like(z), z, male, z * male], dim=-1)
    return _regression(
        folder,
        X,
        earn.log(),
        None,
        None,
        subsample_size,
        "flat priors; beta = M u (whitening by the design matrix); start at least squares",
    )


# ---------------------------------------------------------------------------- eight schools
def eight_schools_noncentered() -> Problem:
    """Non-centred eight schools; J = 8, full batch (no subsampling)."""
    folder = "eight_schools-eight_schools_noncentered"
    data = _read(folder, "data.json")
    y = torch.tensor(data["y"], dtype=DTYPE)
    sigma = torch.tensor(data["sigma"], dtype=DTYPE)
    J = int(data["J"])
    one = torch.tensor(1.0, dtype=DTYPE)

    def model(subsample_size=None):
        theta_trans = pyro.sample("theta_trans", dist.Normal(0.0, one).expand([J]).to_event(1))
        mu = 5.0 * pyro.sample("mu_raw", dist.Normal(0.0, one))  # = mu ~ Normal(0, 5), exactly
        tau = pyro.sample("tau", dist.HalfCauchy(5.0 * one))
        theta = mu + tau * theta_trans
        with pyro.plate("data", J, subsample_size=subsample_size) as idx:
            pyro.sample("y", dist.Normal(theta[idx], sigma[idx]), obs=y[idx])

    weights = sigma.pow(-2)
    init = {
        "theta_trans": torch.zeros(J, dtype=DTYPE),
        "mu_raw": (weights * y).sum() / weights.sum() / 5.0,
        "tau": one.clone(),
    }

    def to_reference(samples):
        mu = 5.0 * samples["mu_raw"]
        theta = mu.unsqueeze(-1) + samples["tau"].unsqueeze(-1) * samples["theta_trans"]
        out = {f"theta[{j + 1}]": theta[..., j] for j in range(J)}
        out["mu"] = mu
        out["tau"] = samples["tau"]
        return out

    return Problem(
        folder=folder,
        model=model,
        num_data=J,
        init_values=init,
        to_reference=to_reference,
        positive_sites=("tau",),
        notes="mu = 5 mu_raw (exact prior rescaling); full batch",
    )


BUILDERS = {
    "sblri-blr": lambda **kw: sblr("sblri-blr", **kw),
    "sblrc-blr": lambda **kw: sblr("sblrc-blr", **kw),
    "earnings-logearn_interaction_z": earnings_logearn_interaction_z,
    "eight_schools-eight_schools_noncentered": eight_schools_noncentered,
}
