"""posteriordb regressions written as plainly as in Stan: no reparametrisation, no whitening.

For the mass-matrix tests (``tests/kernels/test_preconditioning.py``) and the benchmark
(``benchmarks/preconditioning.py``): the sampler must cope with the raw scales and correlations
itself. Each builder returns ``(model, num_data, names)``: ``model(subsample_size=None)`` samples
``beta`` (a vector site) and ``sigma`` (> 0) and observes ``y`` in ``pyro.plate("data", N,
subsample_size=...)``; ``names`` maps the reference's parameter names to functions of
``MCMC.get_samples()``. Priors are exactly those of posteriordb (see its README).
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

__all__ = ["POSTERIORDB", "build", "reference", "least_squares_init"]


def _read(folder: str, name: str) -> dict:
    with open(POSTERIORDB / folder / name) as f:
        return json.load(f)


def reference(folder: str) -> Dict[str, dict]:
    params = _read(folder, "reference.json")["params"]
    return dict(params) if isinstance(params, dict) else {name: stats for name, stats in params}


def _design(folder: str) -> Tuple[torch.Tensor, torch.Tensor]:
    data = _read(folder, "data.json")
    t = lambda key: torch.tensor(data[key], dtype=DTYPE)  # noqa: E731
    if folder in ("sblrc-blr", "sblri-blr"):
        return t("X"), t("y")
    if folder == "kidiq-kidscore_interaction":
        hs, iq = t("mom_hs"), t("mom_iq")
        return torch.stack([torch.ones_like(hs), hs, iq, hs * iq], -1), t("kid_score")
    if folder == "earnings-logearn_interaction_z":
        height, male = t("height"), t("male")
        z = (height - height.mean()) / height.std(unbiased=True)
        return torch.stack([torch.ones_like(z), z, male, z * male], -1), t("earn").log()
    if folder == "diamonds-diamonds":
        X = t("X")[:, 1:]
        return X - X.mean(0), t("Y")
    raise KeyError(folder)


def build(
    folder: str, subsample_size: Optional[int] = None, proper: bool = False
) -> Tuple[Callable, int, Dict[str, Callable]]:
    """``(model, N, {reference name: samples -> tensor})`` for one posteriordb regression.

    ``proper=True`` replaces the flat priors by Normal(0, 1e4) (HalfNormal for sigma), for Pyro's
    NUTS, whose set-up samples from the prior; the posterior sds are below 20, so the change in the
    posterior is of relative order (20 / 1e4)^2 = 4e-6.
    """
    X, y = _design(folder)
    n, d = X.shape
    zero = torch.zeros((), dtype=DTYPE)

    if folder in ("sblrc-blr", "sblri-blr"):

        def priors():
            beta = pyro.sample("beta", dist.Normal(zero, 10.0).expand([d]).to_event(1))
            sigma = pyro.sample("sigma", dist.HalfNormal(10.0 + zero))
            return beta, sigma

    elif folder == "kidiq-kidscore_interaction":

        def priors():
            beta = pyro.sample("beta", _flat((d,), proper))
            sigma = pyro.sample("sigma", dist.HalfCauchy(2.5 + zero))
            return beta, sigma

    elif folder == "earnings-logearn_interaction_z":

        def priors():
            beta = pyro.sample("beta", _flat((d,), proper))
            sigma = pyro.sample("sigma", _flat((), proper, positive=True))
            return beta, sigma

    else:  # diamonds: b ~ Normal(0, 1), Intercept ~ StudentT(3, 8, 10), sigma ~ HalfStudentT(3, 0, 10)

        def priors():
            b = pyro.sample("beta", dist.Normal(zero, 1.0).expand([d]).to_event(1))
            intercept = pyro.sample("intercept", dist.StudentT(3.0, 8.0 + zero, 10.0))
            sigma = pyro.sample("sigma", _flat((), proper, positive=True))
            pyro.factor("sigma_prior", dist.StudentT(3.0, zero, 10.0).log_prob(sigma) + math.log(2.0))
            return b, sigma, intercept

    def model(subsample_size=subsample_size):
        out = priors()
        beta, sigma = out[0], out[1]
        with pyro.plate("data", n, subsample_size=subsample_size) as idx:
            mean = X[idx] @ beta
            if len(out) == 3:
                mean = mean + out[2]
            pyro.sample("y", dist.Normal(mean, sigma), obs=y[idx])

    names: Dict[str, Callable] = {}
    label = "b" if folder == "diamonds-diamonds" else "beta"
    for j in range(d):
        names[f"{label}[{j + 1}]"] = lambda s, j=j: s["beta"][..., j]
    names["sigma"] = lambda s: s["sigma"]
    if folder == "diamonds-diamonds":
        names["Intercept"] = lambda s: s["intercept"]
    return model, n, names


def _flat(shape, proper: bool, positive: bool = False):
    if not proper:
        return dist.ImproperUniform(constraints.positive if positive else constraints.real, (), shape)
    scale = torch.full(shape, 1e4, dtype=DTYPE)
    base = dist.HalfNormal(scale) if positive else dist.Normal(torch.zeros(shape, dtype=DTYPE), scale)
    return base.to_event(len(shape)) if shape else base


def least_squares_init(folder: str) -> Dict[str, torch.Tensor]:
    """Constrained starting values from the data alone: least squares and its residual sd."""
    X, y = _design(folder)
    n, d = X.shape
    if folder == "diamonds-diamonds":
        X1 = torch.cat([torch.ones(n, 1, dtype=DTYPE), X], -1)
        coef = torch.linalg.lstsq(X1, y.unsqueeze(-1)).solution.squeeze(-1)
        resid = y - X1 @ coef
        return {"beta": coef[1:], "intercept": coef[0], "sigma": resid.pow(2).mean().sqrt()}
    coef = torch.linalg.lstsq(X, y.unsqueeze(-1)).solution.squeeze(-1)
    resid = y - X @ coef
    return {"beta": coef, "sigma": (resid.pow(2).sum() / (n - d)).sqrt()}
