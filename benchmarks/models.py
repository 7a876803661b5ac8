"""The problems the benchmarks share, each with its Pyro model and its potential written by hand.

Digits BNN (``vectorized_chains.py`` and its profile and prototypes)
    scikit-learn's ``load_digits`` (N = 1797 images, 64 pixels scaled to [0, 1], 10 classes), a
    64 -> 40 (tanh) -> 10 MLP with N(0, 1) priors on all 3,010 weights and biases, minibatches of B = 128
    through ``pyro.plate("data", N, subsample_size=128)``.
MLP regression (``peers.py``, ``kernel_steps.py``, ``memory.py``)
    N = 10,000 points with 10 inputs generated here, ``y = sin(x_0) + x_1 x_2 / 2 + 0.5 noise``; a
    10 -> h -> h -> 1 tanh MLP with N(0, 1) priors, Gaussian likelihood with sd 0.5, B = 128;
    h = 50 (``small``, 3,151 weights) or 490 (``large``, 246,471 weights).

Each hand-written potential :math:`U(z) = -\\log p(z) - \\frac{N}{B} \\sum_{n \\in I} \\log p(y_n \\mid z)`
takes flat positions ``(K, D)`` in the package's layout (sites sorted by name) and minibatch indices
``(K, B)``, and returns ``(K,)``: the ``energy`` of :class:`harness.HandChains`.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Tuple

import pyro
import pyro.distributions as dist
import torch

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def flat_layout(shapes: Dict[str, Tuple[int, ...]]) -> Dict[str, Tuple[int, int, Tuple[int, ...]]]:
    """``name -> (offset, numel, shape)`` of each site in a flat position, sites sorted by name."""
    offsets, offset = {}, 0
    for name, shape in sorted(shapes.items()):
        offsets[name] = (offset, math.prod(shape), shape)
        offset += math.prod(shape)
    return offsets


def unflatten(z: torch.Tensor, shapes: Dict[str, Tuple[int, ...]]) -> Dict[str, torch.Tensor]:
    """The sites' values from flat positions ``(..., D)``: each ``(..., *shape)``."""
    lead = z.shape[:-1]
    return {name: z[..., o : o + n].reshape(lead + shape) for name, (o, n, shape) in flat_layout(shapes).items()}


# ------------------------------------------------------------------------------------------ digits BNN
DIGITS_HIDDEN, DIGITS_BATCH, DIGITS_PRIOR_SCALE = 40, 128, 1.0


def load_digits():
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    return torch.tensor(digits.data, dtype=torch.float32) / 16.0, torch.tensor(digits.target, dtype=torch.long)


def bnn_model(x, y):
    """64 -> 40 (tanh) -> 10 Bayesian MLP, N(0, 1) priors; the minibatch pattern of the requirement."""
    num_data, num_inputs = x.shape
    num_classes, scale = 10, DIGITS_PRIOR_SCALE
    W1 = pyro.sample("W1", dist.Normal(0.0, scale).expand([num_inputs, DIGITS_HIDDEN]).to_event(2))
    b1 = pyro.sample("b1", dist.Normal(0.0, scale).expand([DIGITS_HIDDEN]).to_event(1))
    W2 = pyro.sample("W2", dist.Normal(0.0, scale).expand([DIGITS_HIDDEN, num_classes]).to_event(2))
    b2 = pyro.sample("b2", dist.Normal(0.0, scale).expand([num_classes]).to_event(1))
    plate = pyro.plate("data", num_data, subsample_size=DIGITS_BATCH)
    idx = plate.indices
    logits = torch.tanh(x[idx] @ W1 + b1) @ W2 + b2
    with plate:
        pyro.sample("y", dist.Categorical(logits=logits), obs=y[idx])


def digits_shapes(num_inputs: int, num_classes: int = 10) -> Dict[str, Tuple[int, ...]]:
    h = DIGITS_HIDDEN
    return {"W1": (num_inputs, h), "W2": (h, num_classes), "b1": (h,), "b2": (num_classes,)}


def digits_energy(x, y) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """All chains at once: a per-chain gather ``x[idx]`` and ``torch.bmm`` for both layers."""
    num_data, shapes = x.shape[0], digits_shapes(x.shape[1])
    dim = sum(math.prod(s) for s in shapes.values())
    log_norm = dim * (math.log(DIGITS_PRIOR_SCALE) + LOG_SQRT_2PI)

    def energy(z: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        p = unflatten(z, shapes)
        hidden = torch.tanh(torch.bmm(x[idx], p["W1"]) + p["b1"].unsqueeze(1))  # x[idx]: (K, B, 64)
        logits = torch.bmm(hidden, p["W2"]) + p["b2"].unsqueeze(1)
        # gather - logsumexp: on this CPU 4x faster than torch.log_softmax over 10 classes
        log_lik = (logits.gather(-1, y[idx].unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)).sum(-1)
        log_prior = (-0.5 / DIGITS_PRIOR_SCALE**2) * (z * z).sum(-1) - log_norm
        return -(log_prior + (num_data / DIGITS_BATCH) * log_lik)

    return energy


# ------------------------------------------------------------------------------------- MLP regression
NUM_DATA, BATCH, INPUTS, NOISE_SD = 10_000, 128, 10, 0.5
STEP_SIZE, FRICTION = 0.01, 1.0  # the SGHMC settings every benchmark on this problem uses
SIZES = {"small": 50, "large": 490}  # hidden width: 3,151 and 246,471 weights


def make_data(dtype=torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_DATA, INPUTS, generator=generator, dtype=dtype)
    noise = NOISE_SD * torch.randn(NUM_DATA, generator=generator, dtype=dtype)
    return x, torch.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] + noise


def shapes(hidden: int) -> Dict[str, Tuple[int, ...]]:
    """Site shapes in the package's flat order (sorted site names)."""
    return {
        "W1": (INPUTS, hidden),
        "W2": (hidden, hidden),
        "W3": (hidden, 1),
        "b1": (hidden,),
        "b2": (hidden,),
        "b3": (1,),
    }


def dim(hidden: int) -> int:
    return sum(math.prod(s) for s in shapes(hidden).values())


def unpack(z: torch.Tensor, hidden: int) -> Dict[str, torch.Tensor]:
    return unflatten(z, shapes(hidden))


def make_model(hidden: int):
    def mlp_model(x, y):
        zero, one = x.new_zeros(()), x.new_ones(())  # the priors on the data's device (a GPU run)
        W1 = pyro.sample("W1", dist.Normal(zero, one).expand([INPUTS, hidden]).to_event(2))
        b1 = pyro.sample("b1", dist.Normal(zero, one).expand([hidden]).to_event(1))
        W2 = pyro.sample("W2", dist.Normal(zero, one).expand([hidden, hidden]).to_event(2))
        b2 = pyro.sample("b2", dist.Normal(zero, one).expand([hidden]).to_event(1))
        W3 = pyro.sample("W3", dist.Normal(zero, one).expand([hidden, 1]).to_event(2))
        b3 = pyro.sample("b3", dist.Normal(zero, one).expand([1]).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=BATCH) as idx:
            mean = (torch.tanh(torch.tanh(x[idx] @ W1 + b1) @ W2 + b2) @ W3 + b3).squeeze(-1)
            pyro.sample("y", dist.Normal(mean, NOISE_SD), obs=y[idx])

    return mlp_model


def log_likelihood(p, xb, yb):
    """Gaussian log-likelihood of a minibatch, summed over its last axis."""
    h = torch.tanh(torch.tanh(xb @ p["W1"] + p["b1"].unsqueeze(-2)) @ p["W2"] + p["b2"].unsqueeze(-2))
    mean = (h @ p["W3"] + p["b3"].unsqueeze(-2)).squeeze(-1)
    r = (yb - mean) / NOISE_SD
    return (-0.5 * r * r - (math.log(NOISE_SD) + LOG_SQRT_2PI)).sum(-1)


def mlp_energy(x, y, hidden: int, num_chains: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One chain: plain matrix products; several: batched (``torch.matmul`` on per-chain minibatches)."""
    log_norm = dim(hidden) * LOG_SQRT_2PI

    def energy(z: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        p = unpack(z if num_chains > 1 else z[0], hidden)
        i = idx if num_chains > 1 else idx[0]
        log_prior = -0.5 * (z * z).sum(-1) - log_norm
        return -(log_prior + (NUM_DATA / BATCH) * log_likelihood(p, x[i], y[i]))

    return energy


# ------------------------------------------------------------------------------- logistic regression
def logistic_laplace(x, y, prior_sd: float, intercept: bool = False, chunk: int = 250_000, tol: float = 1e-10,
                     max_iter: int = 50) -> dict:  # fmt: skip
    """The Laplace approximation of a Bayesian logistic regression with ``Normal(0, prior_sd)`` priors (the
    reference of ``race_nuts.py`` and ``accuracy_vs_nuts.py``): the MAP by Newton's method with step halving
    (float64, the data cast up chunk by chunk), the Hessian of the negative log posterior there,

    .. math:: H = \\sigma_0^{-2} I + \\sum_n p_n (1 - p_n)\\, x_n x_n^\\top, \\quad p_n = \\sigma(x_n \\cdot w),

    and the covariance :math:`H^{-1}`. ``intercept``: a last coefficient ``b`` on a column of ones."""
    n = x.shape[0]
    dim = x.shape[1] + int(intercept)
    precision = 1.0 / prior_sd**2

    def evaluate(theta, need_hessian=True):
        value, grad = 0.5 * precision * float(theta @ theta), precision * theta.clone()
        hess = precision * torch.eye(dim, dtype=torch.float64) if need_hessian else None
        for lo in range(0, n, chunk):
            xc = x[lo : lo + chunk].double()
            if intercept:
                xc = torch.cat([xc, torch.ones(xc.shape[0], 1, dtype=torch.float64)], 1)
            yc = y[lo : lo + chunk].double()
            eta = xc @ theta
            value += float(torch.nn.functional.binary_cross_entropy_with_logits(eta, yc, reduction="sum"))
            p = torch.sigmoid(eta)
            grad += xc.T @ (p - yc)
            if need_hessian:
                hess += (xc * (p * (1 - p)).unsqueeze(-1)).T @ xc
        return value, grad, hess

    theta = torch.zeros(dim, dtype=torch.float64)
    value, grad, hess = evaluate(theta)
    iterations = 0
    for iterations in range(1, max_iter + 1):
        step = torch.linalg.solve(hess, grad)
        t = 1.0
        while True:  # step halving (never needed near the mode; kept for safety from theta = 0)
            new_value, _, _ = evaluate(theta - t * step, need_hessian=False)
            if new_value <= value + 1e-12 * abs(value) or t < 1e-8:
                break
            t *= 0.5
        theta = theta - t * step
        value, grad, hess = evaluate(theta)
        if float((t * step).abs().max()) < tol:
            break
    cov = torch.linalg.inv(hess)
    return {"mean": theta, "sd": cov.diagonal().sqrt(), "cov": cov, "hessian": hess,
            "newton_iterations": iterations, "max_abs_grad": float(grad.abs().max())}  # fmt: skip
