"""Stochastic-gradient Hamiltonian Monte Carlo (Chen et al., 2014), tempered."""

from __future__ import annotations

from typing import Callable, Dict, Optional, Union

import torch
from pyro.infer.autoguide.initialization import init_to_uniform

from ..model.potential import JitMode
from ..schedules import Schedule
from .base import _INITIAL_MOMENTA, SGMCMCKernel, SGMCMCState, _choice, _non_negative, _positive
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
    model, step_size, temperature, num_data, init_strategy, on_divergence, jit_compile :
        As for :class:`~pyro_sgmcmc.SGLD`.
    adapt_step_size, adapt_mass_matrix, full_mass, control_variate, start_at_centre :
        As for :class:`~pyro_sgmcmc.SGLD`. With a mass matrix the momentum (and ``mass``,
        ``friction``) are in preconditioned units.
    friction : float
        :math:`\\alpha \\ge 0`, in units of inverse (normalised) time: the momentum decays by
        :math:`1 - \\epsilon \\alpha / \\sigma^2` per step. Default 1: half the critical damping
        :math:`2 \\sqrt{\\sigma^2 \\lambda}` for normalised curvature :math:`\\lambda = 1` (a posterior
        variance of about :math:`1 / N`).
    mass : float
        :math:`\\sigma^2 > 0`. Default 1.
    initial_momentum : {"zero", "stationary"}
        Start at :math:`m = 0` (default, as SGD) or draw :math:`m \\sim \\mathcal{N}(0, \\sigma^2 T / N)`,
        the stationary momentum at the chosen temperature.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_sgmcmc import SGHMC
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
    ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
    ...         pyro.sample("obs", dist.Normal(mu, 1.), obs=y[idx])
    >>> _ = pyro.set_rng_seed(0)
    >>> y = 3. + torch.randn(100)
    >>> mcmc = MCMC(SGHMC(model, step_size=0.05, friction=2.), num_samples=500, warmup_steps=200, disable_progbar=True)
    >>> mcmc.run(y)
    >>> abs(mcmc.get_samples()["mu"].mean() - y.mean()) < 0.1
    tensor(True)
    """

    def __init__(
        self,
        model: Callable,
        step_size: Union[None, float, Schedule, Callable[[int], float]] = None,
        temperature: float = 1.0,
        num_data: Optional[int] = None,
        friction: float = 1.0,
        mass: float = 1.0,
        initial_momentum: str = "zero",
        init_strategy: Callable = init_to_uniform,
        on_divergence: str = "restart",
        *,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool = True,
        full_mass: Optional[bool] = None,
        control_variate: Union[None, str, Dict[str, torch.Tensor]] = "auto",
        start_at_centre: bool = False,
        jit_compile: JitMode = "auto",
    ) -> None:
        super().__init__(
            model,
            step_size,
            temperature,
            num_data,
            init_strategy,
            on_divergence,
            adapt_step_size=adapt_step_size,
            adapt_mass_matrix=adapt_mass_matrix,
            full_mass=full_mass,
            control_variate=control_variate,
            start_at_centre=start_at_centre,
            jit_compile=jit_compile,
        )
        self.friction = _non_negative(friction, "friction", "the momentum damping alpha")
        self.mass = _positive(mass, "mass")
        self.initial_momentum = _choice(initial_momentum, "initial_momentum", _INITIAL_MOMENTA)

    def _init_auxiliary(self, position: torch.Tensor):
        return self._initial_momentum(position, self.initial_momentum, self.mass), None

    def _transition(
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
