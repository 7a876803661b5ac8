"""The hand-written reference loops every speed benchmark is timed against (re-exported by ``harness.py``).

:class:`HandChains` runs SGLD, SGHMC or SGNHT for ``K`` chains in plain PyTorch on a potential given as a
function: no Pyro, no package code but ``chain_seed`` for its noise streams. Its minibatches come one of two
ways: ``minibatches="randperm"`` (the default, what the speed benchmarks time against) as a user's loop
draws them, ``torch.randperm`` per chain per epoch from the chain's own generator; ``minibatches="package"``
from the package's own stream (``pyro_sgmcmc.chains.minibatch.epoch_orders``, the keyed permutations), so that
the loop reproduces the kernels' trajectories to round-off (the benchmarks check this before they time
anything). Timing against the package's stream would hide the cost of the package's permutation code.

:class:`DeviceHandSGHMC` is SGHMC for ``K`` chains written for an accelerator (one noise draw and one
permutation draw for all chains, no host read in a step): ``gpu.py``'s baseline, eager and in a CUDA graph.

``python benchmarks/hand_loops.py --check`` runs the loops (``minibatches="package"``) against the package's
SGLD, SGHMC and SGNHT on a small logistic regression (same start, same seed, fixed step size, no adaptation)
and prints the largest position difference after 25 steps (two epochs of 10 minibatches begun: the streams
cross an epoch).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Callable, Dict, List, Optional, Tuple

import pyro
import torch

#: the kernels' settings under which the hand loops do the same maths: a fixed step size, the identity
#: mass matrix, plain minibatch gradients (the kernels' defaults adapt all three)
SAME_MATHS = dict(adapt_step_size=False, adapt_mass_matrix=False, control_variate=None)
Energy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class HandChains:
    """SGLD, SGHMC or SGNHT for ``K`` chains in plain PyTorch: the baseline the package is timed against.

    ``energy(z, idx)`` returns the minibatch potential of every chain, shape ``(K,)``,

    .. math:: U_k(z_k) = -\\log p(z_k) - \\frac{N}{B} \\sum_{n \\in I_k} \\log p(y_n \\mid z_k),

    for flat positions ``z`` of shape ``(K, D)`` (sites in the package's order) and minibatch indices ``idx``
    of shape ``(K, B)``. One ``torch.autograd.grad`` gives :math:`\\nabla U` for all chains. With step size
    :math:`\\epsilon`, friction :math:`\\alpha`, mass :math:`\\sigma^2`, temperature :math:`T`, data size
    :math:`N` and :math:`\\zeta \\sim N(0, I)`:

    .. math::
        \\text{SGLD:}\\quad & z' = z - \\tfrac{\\epsilon}{N} \\nabla U + \\sqrt{2 \\epsilon T / N}\\, \\zeta \\\\
        \\text{SGHMC:}\\quad & m' = (1 - \\tfrac{\\epsilon \\alpha}{\\sigma^2}) m - \\tfrac{\\epsilon}{N} \\nabla U
            + \\sqrt{2 \\epsilon \\alpha T / N}\\, \\zeta, \\quad z' = z + \\tfrac{\\epsilon}{\\sigma^2} m' \\\\
        \\text{SGNHT:}\\quad & \\text{the same with } \\alpha \\to \\xi \\text{ in the decay, then }
            \\xi' = \\xi + \\epsilon (m' \\cdot m' / (\\sigma^2 D) - T / N)

    (the package's temperature is per datum: its noise temperature is :math:`T / N`). One ``torch.Generator``
    per chain seeded with ``chain_seed(seed, c)``, the noise drawn from it row by row (a user's loop calling
    ``normal_``; with ``minibatches="package"`` the package's keyed noise instead); minibatches walking
    through each chain's epoch permutation, the next epoch begun when fewer than ``B`` indices remain. The
    permutations: ``minibatches="randperm"`` (default), ``torch.randperm(N)`` per chain per epoch from that
    chain's generator (a user's loop; the noise then differs from the package's); ``minibatches="package"``,
    the package's keyed permutation of plate ``plate`` (:func:`pyro_sgmcmc.chains.minibatch.epoch_orders`, a
    function of ``(seed, chain, plate, epoch)``, whole epochs evaluated at once), and the noise the package's
    keyed draws (:meth:`~pyro_sgmcmc.chains.streams.ChainGenerators.fill_normal` at the step), so both streams
    are the package's. The step order is the kernels': noise, move with the
    cached gradient, new minibatch, new gradient. ``in_place=True`` writes the SGHMC update as fused in-place
    operations (the fastest hand form); ``keep_draws`` also keeps a copy of every position, as an MCMC run
    that returns its draws must.
    """

    def __init__(
        self,
        energy: Energy,
        num_data: int,
        batch_size: int,
        initial_position: torch.Tensor,
        seed: int,
        method: str = "SGHMC",
        step_size: float = 0.01,
        friction: float = 1.0,
        mass: float = 1.0,
        temperature: float = 1.0,
        in_place: bool = False,
        keep_draws: bool = False,
        plate: str = "data",
        minibatches: str = "randperm",
    ):
        from pyro_sgmcmc.chains.streams import chain_seed  # here: storage.py may time an older package

        if method not in ("SGLD", "SGHMC", "SGNHT"):
            raise ValueError(f"method must be SGLD, SGHMC or SGNHT; got {method!r}")
        if minibatches not in ("randperm", "package"):
            raise ValueError(f"minibatches must be 'randperm' or 'package'; got {minibatches!r}")
        self.energy, self.method, self.in_place = energy, method, in_place
        self.num_data, self.batch_size = num_data, batch_size
        self.step_size, self.friction, self.mass, self.temperature = step_size, friction, mass, temperature
        self.num_chains, self.dim = initial_position.shape
        self.generators = [torch.Generator().manual_seed(chain_seed(seed, c)) for c in range(self.num_chains)]
        self.minibatches, self.plate = minibatches, plate
        if minibatches == "package":  # keys from (seed, chain, plate, epoch), the noise from (seed, chain, step)
            from pyro_sgmcmc.chains.minibatch import epoch_orders
            from pyro_sgmcmc.chains.streams import ChainGenerators

            self.streams, self.epoch_orders = ChainGenerators(seed, range(self.num_chains)), epoch_orders
        self.order = torch.empty((self.num_chains, num_data), dtype=torch.long)
        self.epoch, self.cursor, self.steps = 0, num_data, 0
        self.position = initial_position.clone()
        self.momentum = torch.zeros_like(self.position)
        self.thermostat = torch.full((self.num_chains,), friction, dtype=self.position.dtype)
        self.noise_buffer = torch.empty_like(self.position)
        self.draws: Optional[List[torch.Tensor]] = [] if keep_draws else None
        self.potential, self.grad = self.potential_and_grad(self.position, self.next_indices())

    def next_indices(self) -> torch.Tensor:
        """The next ``(K, B)`` minibatch indices, each chain walking through its own epoch permutation
        (``torch.randperm`` from its generator, or the package's keyed permutation)."""
        if self.cursor + self.batch_size > self.num_data:
            self.epoch += 1
            if self.minibatches == "randperm":  # a user's loop: a fresh permutation per chain per epoch
                for row, generator in zip(self.order, self.generators):
                    row.copy_(torch.randperm(self.num_data, generator=generator))
            else:
                self.order = self.epoch_orders(self.streams, self.plate, self.num_data, self.epoch)
            self.cursor = 0
        idx = self.order[:, self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return idx

    def potential_and_grad(self, z: torch.Tensor, idx: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            energy = self.energy(z, idx)
            (grad,) = torch.autograd.grad(energy.sum(), z)
        return energy.detach(), grad

    def noise(self) -> torch.Tensor:
        out = self.noise_buffer if self.in_place else torch.empty_like(self.position)
        if self.minibatches == "package":  # the package's keyed draw of this step
            return self.streams.fill_normal(out, step=self.steps)
        for row, generator in zip(out, self.generators):
            row.normal_(generator=generator)
        return out

    def step(self) -> None:
        eps, n = self.step_size, self.num_data
        noise = self.noise()
        if self.method == "SGLD":
            scale = math.sqrt(2.0 * eps * self.temperature / n)
            self.position = self.position - (eps / n) * self.grad + scale * noise
        elif self.in_place:  # SGHMC as fused in-place operations
            self.momentum.mul_(1.0 - eps * self.friction / self.mass).add_(self.grad, alpha=-eps / n)
            self.momentum.add_(noise, alpha=math.sqrt(2.0 * eps * self.friction * self.temperature / n))
            self.position.add_(self.momentum, alpha=eps / self.mass)
        else:
            friction = self.friction if self.method == "SGHMC" else self.thermostat.unsqueeze(-1)
            scale = math.sqrt(2.0 * eps * self.temperature / n * self.friction)
            self.momentum = (1.0 - eps * friction / self.mass) * self.momentum - (eps / n) * self.grad + scale * noise
            self.position = self.position + (eps / self.mass) * self.momentum
            if self.method == "SGNHT":
                kinetic = (self.momentum * self.momentum).sum(-1) / (self.mass * self.dim)
                self.thermostat = self.thermostat + eps * (kinetic - self.temperature / n)
        self.potential, self.grad = self.potential_and_grad(self.position, self.next_indices())
        self.steps += 1
        if self.draws is not None:
            self.draws.append(self.position.clone())


class DeviceHandSGHMC:
    """SGHMC for ``K`` chains as one would write it for an accelerator: the baseline of ``gpu.py``.

    The maths of :class:`HandChains` (SGHMC, fixed step :math:`\\epsilon`, friction :math:`\\alpha`, mass
    :math:`\\sigma^2`, noise temperature :math:`T / N`), written so that a step issues the same few operators
    whatever ``K`` and reads nothing back to the host:

    * the noise of all chains in one draw from torch's default generator of the device (``normal_`` on a
      buffer: a CUDA graph can replay it), seeded with ``torch.manual_seed(seed)``;
    * each chain's minibatches walk through its own permutation of the data, all chains' permutations drawn
      in one call per epoch (``torch.rand(K, N).argsort(-1)``: a uniformly random permutation per row; one
      chain: ``torch.randperm``);
    * the update as fused in-place operations on fixed buffers, the gradient by one ``torch.autograd.grad``.

    :meth:`update` (one step on given indices) has static shapes and no host read: ``gpu.py`` captures ten of
    them in a CUDA graph. ``energy(z, idx)`` as in :class:`HandChains`.
    """

    def __init__(
        self, energy: Energy, num_data: int, batch_size: int, initial_position: torch.Tensor, seed: int,
        step_size: float = 0.01, friction: float = 1.0, mass: float = 1.0, temperature: float = 1.0,
    ):  # fmt: skip
        torch.manual_seed(seed)
        self.energy, self.num_data, self.batch_size = energy, num_data, batch_size
        self.num_chains = initial_position.shape[0]
        self.decay = 1.0 - step_size * friction / mass
        self.drift = -step_size / num_data
        self.noise_scale = math.sqrt(2.0 * step_size * friction * temperature / num_data)
        self.move = step_size / mass
        self.position = initial_position.clone()
        self.momentum = torch.zeros_like(self.position)
        self.noise = torch.empty_like(self.position)
        self.order = torch.empty(0, dtype=torch.long, device=self.position.device)
        self.cursor = num_data
        self.potential, self.grad = self.potential_and_grad(self.position, self.next_indices())

    def next_indices(self) -> torch.Tensor:
        """The next ``(K, B)`` minibatch indices (a new permutation per chain at each epoch's start)."""
        if self.cursor + self.batch_size > self.num_data:
            device, n = self.position.device, self.num_data
            if self.num_chains == 1:
                self.order = torch.randperm(n, device=device).unsqueeze(0)
            else:
                self.order = torch.rand(self.num_chains, n, device=device).argsort(-1)
            self.cursor = 0
        idx = self.order[:, self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return idx

    def potential_and_grad(self, z: torch.Tensor, idx: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            energy = self.energy(z, idx)
            (grad,) = torch.autograd.grad(energy.sum(), z)
        return energy.detach(), grad

    def update(self, idx: torch.Tensor) -> None:
        """One step on minibatch ``idx``: noise, move with the cached gradient, new potential and gradient."""
        self.noise.normal_()
        self.momentum.mul_(self.decay).add_(self.grad, alpha=self.drift).add_(self.noise, alpha=self.noise_scale)
        self.position.add_(self.momentum, alpha=self.move)
        potential, grad = self.potential_and_grad(self.position, idx)
        self.potential = potential
        self.grad.copy_(grad)

    def step(self) -> None:
        self.update(self.next_indices())


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def check_against_kernels(steps: int = 25, chains: int = 3) -> Dict[str, float]:
    """The reference loops against SGLD, SGHMC and SGNHT on a small logistic regression (float64, fixed step
    size, no adaptation): the largest position difference after ``steps`` steps, per method."""
    import pyro.distributions as dist

    from pyro_sgmcmc import SGHMC, SGLD, SGNHT

    n, d, batch, seed = 500, 5, 50, 0
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = (x @ torch.randn(d, generator=g, dtype=torch.float64) > 0).double()

    def model(x, y):
        w = pyro.sample("w", dist.Normal(x.new_zeros(()), 1.0).expand([d]).to_event(1))
        with pyro.plate("data", n, subsample_size=batch) as idx:
            pyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    def energy(z, idx):
        logits = torch.bmm(x[idx], z.unsqueeze(-1)).squeeze(-1)
        log_lik = -torch.nn.functional.binary_cross_entropy_with_logits(logits, y[idx], reduction="none").sum(-1)
        log_prior = -0.5 * (z * z).sum(-1) - 0.5 * d * math.log(2 * math.pi)
        return -(log_prior + (n / batch) * log_lik)

    init = 0.1 * torch.randn(chains, d, generator=g, dtype=torch.float64)
    out = {}
    for method, kernel_class in (("SGLD", SGLD), ("SGHMC", SGHMC), ("SGNHT", SGNHT)):
        kernel = kernel_class(model, step_size=0.01, **SAME_MATHS)
        with pyro.validation_enabled(False):
            kernel.setup_chains(0, (x, y), {}, num_chains=chains, initial_params={"w": init}, seed=seed)
            hand = HandChains(energy, n, batch, init, seed, method=method, step_size=0.01, minibatches="package")
            for _ in range(steps):
                kernel.step()
                hand.step()
        out[method] = max_abs_diff(kernel.state.position, hand.position)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--check", action="store_true", help="the reference loops against the package's kernels")
    if parser.parse_args().check:
        print(json.dumps(check_against_kernels()))
