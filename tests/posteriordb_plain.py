"""The ten posteriordb posteriors written as plainly as in Stan: no reparametrisation, no whitening.

For the mass-matrix tests (``tests/kernels/test_preconditioning.py``) and the benchmark
(``benchmarks/preconditioning.py``): the sampler must cope with the raw scales and correlations
itself. Priors and likelihoods are exactly those of posteriordb (see its README); the covariates are
raw (only diamonds' design is column-centred and earnings' height standardised, as in posteriordb).

``build(folder, subsample_size=None, proper=False)`` returns ``(model, num_data, names)``:

* ``model(subsample_size=...)`` samples every parameter at global sites (outside all plates) and
  puts every likelihood term in the one observation plate ``pyro.plate("data", num_data,
  subsample_size=subsample_size)``; all tensors are float64 (``DTYPE``);
* ``num_data`` is the size of that plate (the number of likelihood terms);
* ``names`` maps every parameter name of the folder's ``reference.json`` (``'beta[1]'``,
  ``'sigma'``, ``'theta[3]'``, ...) to a function of ``MCMC.get_samples()`` (constrained values,
  possibly with leading chain / sample axes).

Flat priors are ``dist.ImproperUniform`` (``proper=False``) or, with ``proper=True``, wide proper
priors for Pyro's NUTS, whose set-up samples the prior (see :func:`_flat`). The models, by folder:

* linear regressions, sites ``beta`` (vector) and ``sigma`` (> 0), ``y ~ Normal(X beta, sigma)``:
  ``sblrc-blr``, ``sblri-blr`` (beta ~ Normal(0, 10), sigma ~ HalfNormal(10));
  ``kidiq-kidscore_momiq`` (X = [1, mom_iq]; beta flat, sigma ~ HalfCauchy(2.5));
  ``kidiq-kidscore_interaction`` (X = [1, mom_hs, mom_iq, mom_hs * mom_iq]; as momiq);
  ``earnings-logearn_interaction_z`` (X = [1, z, male, z * male], log earn; beta, sigma flat);
  ``nes2000-nes`` (X = [1, real_ideo, race_adj, age==2, age==3, age==4, educ1, gender, income],
  partyid7; beta, sigma flat);
* with a separate intercept site: ``diamonds-diamonds`` (``intercept`` ~ StudentT(3, 8, 10),
  ``beta`` = b ~ Normal(0, 1) on the centred design, sigma ~ HalfStudentT(3, 0, 10));
  ``arK-arK`` (AR(5): ``alpha``, ``beta`` ~ Normal(0, 10), sigma ~ HalfCauchy(2.5); the plate runs
  over the T - K terms t = K+1..T, rows of the lag design [y_{t-1}, ..., y_{t-K}]);
* ``eight_schools-eight_schools_noncentered``: ``theta_trans`` ~ Normal(0, 1) (vector of J),
  ``mu`` ~ Normal(0, 5), ``tau`` ~ HalfCauchy(5); the plate runs over the J schools,
  y_j ~ Normal(mu + tau theta_trans_j, sigma_j); ``theta`` is computed in ``names``;
* ``low_dim_gauss_mix-low_dim_gauss_mix``: ``mu`` ordered (support ``constraints.ordered_vector``,
  iid Normal(0, 2) restricted to mu1 < mu2), ``sigma`` ~ HalfNormal(2) (vector of 2),
  ``theta`` ~ Beta(5, 5); y_n ~ theta Normal(mu1, sigma1) + (1 - theta) Normal(mu2, sigma2)
  (``MixtureSameFamily``).

``least_squares_init(folder)`` gives a starting point from the data for the regressions (including
arK); ``data_init(folder)`` for every folder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints

POSTERIORDB = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "posteriordb"
DTYPE = torch.float64

__all__ = ["POSTERIORDB", "FOLDERS", "build", "reference", "least_squares_init", "data_init"]

FOLDERS = [
    "sblrc-blr",
    "sblri-blr",
    "kidiq-kidscore_momiq",
    "kidiq-kidscore_interaction",
    "earnings-logearn_interaction_z",
    "nes2000-nes",
    "arK-arK",
    "eight_schools-eight_schools_noncentered",
    "low_dim_gauss_mix-low_dim_gauss_mix",
    "diamonds-diamonds",
]

# regressions with the intercept at its own site (not a column of the design): folder -> site name
_INTERCEPT = {"diamonds-diamonds": "intercept", "arK-arK": "alpha"}


def _read(folder: str, name: str) -> dict:
    with open(POSTERIORDB / folder / name) as f:
        return json.load(f)


def _data(folder: str) -> Callable[[str], torch.Tensor]:
    data = _read(folder, "data.json")
    return lambda key: torch.tensor(data[key], dtype=DTYPE)


def reference(folder: str) -> Dict[str, dict]:
    params = _read(folder, "reference.json")["params"]
    return dict(params) if isinstance(params, dict) else {name: stats for name, stats in params}


def _design(folder: str) -> Tuple[torch.Tensor, torch.Tensor]:
    t = _data(folder)
    if folder in ("sblrc-blr", "sblri-blr"):
        return t("X"), t("y")
    if folder == "kidiq-kidscore_momiq":
        iq = t("mom_iq")
        return torch.stack([torch.ones_like(iq), iq], -1), t("kid_score")
    if folder == "kidiq-kidscore_interaction":
        hs, iq = t("mom_hs"), t("mom_iq")
        return torch.stack([torch.ones_like(hs), hs, iq, hs * iq], -1), t("kid_score")
    if folder == "earnings-logearn_interaction_z":
        height, male = t("height"), t("male")
        z = (height - height.mean()) / height.std(unbiased=True)
        return torch.stack([torch.ones_like(z), z, male, z * male], -1), t("earn").log()
    if folder == "nes2000-nes":
        age = t("age_discrete")
        columns = [t("real_ideo"), t("race_adj"), (age == 2).to(DTYPE), (age == 3).to(DTYPE), (age == 4).to(DTYPE)]
        columns += [t("educ1"), t("gender"), t("income")]
        return torch.stack([torch.ones_like(age)] + columns, -1), t("partyid7")
    if folder == "arK-arK":  # row t (t = K+1..T, 1-based) is [y_{t-1}, ..., y_{t-K}]; the intercept is alpha
        y, K = t("y"), int(_read(folder, "data.json")["K"])
        T = len(y)
        return torch.stack([y[K - k : T - k] for k in range(1, K + 1)], -1), y[K:]
    if folder == "diamonds-diamonds":
        X = t("X")[:, 1:]
        return X - X.mean(0), t("Y")
    raise KeyError(folder)


def build(
    folder: str, subsample_size: Optional[int] = None, proper: bool = False
) -> Tuple[Callable, int, Dict[str, Callable]]:
    """``(model, N, {reference name: samples -> tensor})`` for one posteriordb posterior.

    ``proper=True`` replaces the flat priors by Normal(0, 1e4) (HalfNormal for sigma), for Pyro's
    NUTS, whose set-up samples from the prior; the posterior sds are below 20, so the change in the
    posterior is of relative order (20 / 1e4)^2 = 4e-6. Folders without flat priors ignore it.
    """
    if folder == "eight_schools-eight_schools_noncentered":
        return _eight_schools(folder, subsample_size)
    if folder == "low_dim_gauss_mix-low_dim_gauss_mix":
        return _gauss_mix(folder, subsample_size)

    X, y = _design(folder)
    n, d = X.shape
    zero = torch.zeros((), dtype=DTYPE)

    if folder in ("sblrc-blr", "sblri-blr"):

        def priors():
            beta = pyro.sample("beta", dist.Normal(zero, 10.0).expand([d]).to_event(1))
            sigma = pyro.sample("sigma", dist.HalfNormal(10.0 + zero))
            return beta, sigma

    elif folder in ("kidiq-kidscore_interaction", "kidiq-kidscore_momiq"):

        def priors():
            beta = pyro.sample("beta", _flat((d,), proper))
            sigma = pyro.sample("sigma", dist.HalfCauchy(2.5 + zero))
            return beta, sigma

    elif folder in ("earnings-logearn_interaction_z", "nes2000-nes"):

        def priors():
            beta = pyro.sample("beta", _flat((d,), proper))
            sigma = pyro.sample("sigma", _flat((), proper, positive=True))
            return beta, sigma

    elif folder == "arK-arK":  # alpha, beta ~ Normal(0, 10); sigma ~ HalfCauchy(2.5)

        def priors():
            alpha = pyro.sample("alpha", dist.Normal(zero, 10.0))
            beta = pyro.sample("beta", dist.Normal(zero, 10.0).expand([d]).to_event(1))
            sigma = pyro.sample("sigma", dist.HalfCauchy(2.5 + zero))
            return beta, sigma, alpha

    elif folder == "diamonds-diamonds":  # b ~ Normal(0, 1), Intercept ~ StudentT(3, 8, 10), sigma ~ HalfT(3, 0, 10)

        def priors():
            b = pyro.sample("beta", dist.Normal(zero, 1.0).expand([d]).to_event(1))
            intercept = pyro.sample("intercept", dist.StudentT(3.0, 8.0 + zero, 10.0))
            sigma = pyro.sample("sigma", _flat((), proper, positive=True))
            pyro.factor("sigma_prior", dist.StudentT(3.0, zero, 10.0).log_prob(sigma) + math.log(2.0))
            return b, sigma, intercept

    else:
        raise KeyError(folder)

    def model(subsample_size=subsample_size):
        out = priors()
        beta, sigma = out[0], out[1]
        with pyro.plate("data", n, subsample_size=subsample_size) as idx:
            mean = X[idx] @ beta
            if len(out) == 3:
                mean = mean + out[2]
            pyro.sample("y", dist.Normal(mean, sigma), obs=y[idx])

    names: Dict[str, Callable] = {}
    if folder == "arK-arK":
        names["alpha"] = lambda s: s["alpha"]
    label = "b" if folder == "diamonds-diamonds" else "beta"
    for j in range(d):
        names[f"{label}[{j + 1}]"] = lambda s, j=j: s["beta"][..., j]
    names["sigma"] = lambda s: s["sigma"]
    if folder == "diamonds-diamonds":
        names["Intercept"] = lambda s: s["intercept"]
    return model, n, names


def _eight_schools(folder: str, subsample_size: Optional[int]) -> Tuple[Callable, int, Dict[str, Callable]]:
    """Non-centred eight schools; the plate (over the J schools) holds the likelihood only, the
    ``theta_trans`` vector is a global site (a latent site may not sit in a subsampled plate)."""
    t = _data(folder)
    y, sigma = t("y"), t("sigma")
    J = len(y)
    zero = torch.zeros((), dtype=DTYPE)

    def model(subsample_size=subsample_size):
        mu = pyro.sample("mu", dist.Normal(zero, 5.0))
        tau = pyro.sample("tau", dist.HalfCauchy(5.0 + zero))
        theta_trans = pyro.sample("theta_trans", dist.Normal(zero, 1.0).expand([J]).to_event(1))
        with pyro.plate("data", J, subsample_size=subsample_size) as idx:
            pyro.sample("y", dist.Normal(mu + tau * theta_trans[..., idx], sigma[idx]), obs=y[idx])

    names: Dict[str, Callable] = {
        f"theta[{j + 1}]": lambda s, j=j: s["mu"] + s["tau"] * s["theta_trans"][..., j] for j in range(J)
    }
    names["mu"] = lambda s: s["mu"]
    names["tau"] = lambda s: s["tau"]
    return model, J, names


class _OrderedNormal(dist.TorchDistribution):
    """Stan's ``ordered[n] mu; mu ~ normal(loc, scale)``: iid Normal(loc, scale) restricted to
    mu_1 < ... < mu_n, i.e. the law of n sorted iid draws (density n! prod Normal), proper and
    with support ``constraints.ordered_vector`` (Pyro's ``biject_to`` gives an OrderedTransform)."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.ordered_vector

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, n: int, validate_args=None) -> None:
        self.loc, self.scale, self.n = loc, scale, n
        super().__init__(batch_shape=torch.Size(), event_shape=torch.Size([n]), validate_args=validate_args)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        with torch.no_grad():
            draws = torch.normal(self.loc.expand(tuple(sample_shape) + (self.n,)), self.scale)
            return draws.sort(-1).values

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return dist.Normal(self.loc, self.scale).log_prob(value).sum(-1) + math.lgamma(self.n + 1)


def _gauss_mix(folder: str, subsample_size: Optional[int]) -> Tuple[Callable, int, Dict[str, Callable]]:
    y = _data(folder)("y")
    n = len(y)
    zero = torch.zeros((), dtype=DTYPE)

    def model(subsample_size=subsample_size):
        mu = pyro.sample("mu", _OrderedNormal(zero, 2.0 + zero, 2))
        sigma = pyro.sample("sigma", dist.HalfNormal(2.0 + zero).expand([2]).to_event(1))
        theta = pyro.sample("theta", dist.Beta(5.0 + zero, 5.0 + zero))
        # log_mix(theta, Normal(mu1, sigma1), Normal(mu2, sigma2)) per datum
        weights = dist.Categorical(logits=torch.stack([theta.log(), torch.log1p(-theta)], -1))
        mixture = dist.MixtureSameFamily(weights, dist.Normal(mu, sigma))
        with pyro.plate("data", n, subsample_size=subsample_size) as idx:
            pyro.sample("y", mixture, obs=y[idx])

    names: Dict[str, Callable] = {}
    for site in ("mu", "sigma"):
        for j in range(2):
            names[f"{site}[{j + 1}]"] = lambda s, site=site, j=j: s[site][..., j]
    names["theta"] = lambda s: s["theta"]
    return model, n, names


def _flat(shape, proper: bool, positive: bool = False):
    if not proper:
        return dist.ImproperUniform(constraints.positive if positive else constraints.real, (), shape)
    scale = torch.full(shape, 1e4, dtype=DTYPE)
    base = dist.HalfNormal(scale) if positive else dist.Normal(torch.zeros(shape, dtype=DTYPE), scale)
    return base.to_event(len(shape)) if shape else base


def least_squares_init(folder: str) -> Dict[str, torch.Tensor]:
    """Constrained starting values from the data alone: least squares and its residual sd
    (the regressions only: every folder but eight schools and the Gaussian mixture)."""
    X, y = _design(folder)
    n, d = X.shape
    if folder in _INTERCEPT:
        X1 = torch.cat([torch.ones(n, 1, dtype=DTYPE), X], -1)
        coef = torch.linalg.lstsq(X1, y.unsqueeze(-1)).solution.squeeze(-1)
        resid = y - X1 @ coef
        return {"beta": coef[1:], _INTERCEPT[folder]: coef[0], "sigma": resid.pow(2).mean().sqrt()}
    coef = torch.linalg.lstsq(X, y.unsqueeze(-1)).solution.squeeze(-1)
    resid = y - X @ coef
    return {"beta": coef, "sigma": (resid.pow(2).sum() / (n - d)).sqrt()}


def data_init(folder: str) -> Dict[str, torch.Tensor]:
    """Constrained starting values from the data alone, for every folder: :func:`least_squares_init`
    for the regressions; for eight schools mu at the precision-weighted mean of y, tau = 1 and
    theta_trans = 0; for the mixture, y split at its mean (each side's mean and sd, and the share
    below the mean as theta)."""
    if folder == "eight_schools-eight_schools_noncentered":
        t = _data(folder)
        y, w = t("y"), t("sigma").pow(-2)
        return {"mu": (w * y).sum() / w.sum(), "tau": torch.ones((), dtype=DTYPE), "theta_trans": torch.zeros_like(y)}
    if folder == "low_dim_gauss_mix-low_dim_gauss_mix":
        y = _data(folder)("y")
        low = y < y.mean()
        parts = (y[low], y[~low])
        return {
            "mu": torch.stack([p.mean() for p in parts]),
            "sigma": torch.stack([p.std() for p in parts]),
            "theta": low.to(DTYPE).mean(),
        }
    return least_squares_init(folder)
