"""Models shared by the distributed tests."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch


def regression(x, y, batch):
    """Linear regression, ``w ~ N(0, I)``, ``y_n ~ N(x_n . w, 1)``, minibatches of ``batch`` through the data plate."""
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1], dtype=x.dtype), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=batch) as idx:
        pyro.sample("y", dist.Normal(x[idx] @ w, 1.0), obs=y[idx])
