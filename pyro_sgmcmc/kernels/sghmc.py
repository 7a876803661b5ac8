"""Stochastic-gradient Hamiltonian Monte Carlo (Chen et al., 2014), tempered."""

from __future__ import annotations

from typing import Dict

import torch

from .adapt.stability import SECOND_ORDER_CONSTANT, StabilityRule
from .arguments import INIT_MOMENTA, choice, non_negative, positive, renamed_attribute
from .base import SGMCMCKernel, SGMCMCState
from .diffusions import kinetic_energy as _kinetic_energy
from .diffusions import underdamped_step

__all__ = ["SGHMC"]


class SGHMC(SGMCMCKernel):
    """Stochastic-gradient HMC (underdamped Langevin with friction) for :class:`pyro.infer.MCMC`.

    .. math::
        m_{t+1} &= m_t + \\epsilon\\, N^{-1} \\nabla \\widehat{\\log \\pi}(z_t)
                   - \\epsilon \\alpha\\, m_t / \\sigma^2 + \\sqrt{2 \\epsilon \\alpha T / N}\\, \\zeta_t \\\\
        z_{t+1} &= z_t + \\epsilon\\, m_{t+1} / \\sigma^2

    (``D`` = diag(0, alpha), ``Q`` the symplectic block in the seed paper's recipe). The stationary
    distribution of the continuous dynamics is :math:`\\pi(z)^{1/T} \\times \\mathcal{N}(m; 0, \\sigma^2 T / N)`.
    At ``T = 0`` the trajectory is exactly that of
    ``torch.optim.SGD(lr=eps / sigma^2, momentum=1 - eps * alpha / sigma^2, dampening=1 - eps)``
    on :math:`U / N` (PyTorch's momentum buffer is :math:`-m`), so SGHMC at ``T = 0`` *is* SGD with momentum.
    PyTorch copies the first gradient into an empty momentum buffer without dampening; seed it with
    zeros (``optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p)``, i.e. :math:`-m_0`) for the
    trajectories to agree from the first step.

    Parameters
    ----------
    model, step_size, and the shared keyword arguments :
        As for :class:`~pyro_sgmcmc.SGLD`. With a mass matrix the momentum (and ``mass``, ``friction``) are in
        preconditioned units.
    friction : float
        :math:`\\alpha \\ge 0`, in units of inverse (normalised) time: the momentum decays by
        :math:`1 - \\epsilon \\alpha / \\sigma^2` per step. Default 1: half the critical damping
        :math:`2 \\sqrt{\\sigma^2 \\lambda}` for normalised curvature :math:`\\lambda = 1` (a posterior
        variance of about :math:`1 / N`).
    mass : float
        :math:`\\sigma^2 > 0`. Default 1.
    init_momentum : {"zero", "stationary"}
        Start at :math:`m = 0` (default, as SGD) or draw :math:`m \\sim \\mathcal{N}(0, \\sigma^2 T / N)`,
        the stationary momentum at the chosen temperature. (Was ``initial_momentum``.)

    Examples
    --------
    Eight chains advanced together (what ``MCMC(..., chain_method="vectorized")`` does), each with its own noise
    and minibatches; at ``temperature=0`` the same chains would follow SGD with momentum exactly.

    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_sgmcmc import SGHMC
    >>> def regression(x, y):
    ...     w = pyro.sample("w", dist.Normal(0., 1.).expand([2]).to_event(1))
    ...     with pyro.plate("rows", len(y), subsample_size=16) as i:
    ...         pyro.sample("y", dist.Normal(x[i] @ w, 0.5), obs=y[i])
    >>> x = torch.randn(400, 2, generator=torch.Generator().manual_seed(0))
    >>> y = x @ torch.tensor([1.0, -1.0])
    >>> kernel = SGHMC(regression, step_size=0.05, friction=2.0)
    >>> kernel.setup_chains(100, (x, y), num_chains=8, seed=0)
    >>> for _ in range(300):
    ...     state = kernel.step()
    >>> state.momentum.shape, bool((state.position.mean(0) - torch.tensor([1.0, -1.0])).abs().max() < 0.1)
    (torch.Size([8, 2]), True)
    """

    LEGACY_POSITIONAL = (
        "temperature", "num_data", "friction", "mass", "initial_momentum", "init_strategy", "on_divergence",
    )  # fmt: skip

    def configure_dynamics(self, *, friction: float = 1.0, mass: float = 1.0, init_momentum: str = "zero") -> None:
        """SGHMC's own arguments (Parameters above), after the shared ones."""
        self.friction = non_negative(friction, "friction", "the momentum damping alpha")
        self.mass = positive(mass, "mass")
        self.init_momentum = choice(init_momentum, "init_momentum", INIT_MOMENTA)

    @property
    def damping(self) -> float:
        return self.friction

    def warmup_stability_rule(self) -> StabilityRule:
        """Second order (symplectic Euler: :math:`\\epsilon = 0.4 / \\sqrt{\\lambda_{max}}`), damped by the friction."""
        return StabilityRule(SECOND_ORDER_CONSTANT, second_order=True, damping=self.friction)

    initial_momentum = renamed_attribute("initial_momentum", "init_momentum")

    def _init_auxiliary(self, position: torch.Tensor):
        return self._initial_momentum(position, self.init_momentum, self.mass), None

    def transition(
        self, state: SGMCMCState, drift: torch.Tensor, step_size: float, noise, drift_scale: float = 1.0, out=None
    ):
        position, momentum = underdamped_step(
            state.position,
            state.momentum,
            drift,
            step_size,
            self.noise_temperature,
            self.friction,
            self.mass,
            noise,
            drift_scale,
            out,
        )
        return position, momentum, None

    def _auxiliary_stats(self, state: SGMCMCState) -> Dict[str, torch.Tensor]:
        return {"kinetic_energy": _kinetic_energy(state.momentum, self.mass)}
