"""Stochastic-gradient Nose-Hoover thermostat (Ding et al., 2014), tempered."""

from __future__ import annotations

from typing import Callable, Dict, Optional, Union

import torch
from pyro.infer.autoguide.initialization import init_to_uniform

from ..model.potential import JitMode
from ..schedules import Schedule
from .base import _INITIAL_MOMENTA, SGMCMCKernel, SGMCMCState, _choice, _non_negative, _positive
from .diffusions import kinetic_energy as _kinetic_energy
from .diffusions import nose_hoover_step

__all__ = ["SGNHT"]


class SGNHT(SGMCMCKernel):
    """Stochastic-gradient Nose-Hoover thermostat for :class:`pyro.infer.MCMC`.

    .. math::
        m_{t+1} &= m_t + \\epsilon\\, N^{-1} \\nabla \\widehat{\\log \\pi}(z_t)
                   - \\epsilon \\xi_t\\, m_t / \\sigma^2 + \\sqrt{2 \\epsilon \\alpha T / N}\\, \\zeta_t \\\\
        z_{t+1} &= z_t + \\epsilon\\, m_{t+1} / \\sigma^2 \\\\
        \\xi_{t+1} &= \\xi_t + \\epsilon \\left( m_{t+1} \\cdot m_{t+1} / (\\sigma^2 d) - T / N \\right)

    The thermostat :math:`\\xi` acts as an adaptive friction that holds the kinetic temperature at
    :math:`T / N`, absorbing gradient noise of unknown size. SGNHT has no optimiser limit: at
    ``T = 0`` the thermostat only grows.

    The thermostat relaxes slowly: its equation moves :math:`\\xi` by :math:`\\epsilon` times the
    excess kinetic temperature, whose scale is :math:`T / N`. A chain started far from the typical
    set heats the thermostat on its way in (the SG-MCMC tutorial in the docs shows it: thermostats well
    above their starting value ``diffusion`` at the end of a short run, and draws too narrow), and the
    overdamped chain then explores too little for a long time. Start near the mode (a MAP or a
    least-squares fit) or use a long warmup; SGHMC has no such transient.

    Parameters
    ----------
    model, step_size, temperature, num_data, init_strategy, on_divergence, jit_compile :
        As for :class:`~pyro_sgmcmc.SGLD`.
    adapt_step_size, adapt_mass_matrix, full_mass, control_variate, start_at_centre :
        As for :class:`~pyro_sgmcmc.SGLD`. With a mass matrix the momentum (and ``mass``,
        ``diffusion``) are in preconditioned units.
    diffusion : float
        :math:`\\alpha \\ge 0`, the injected-noise coefficient. Default 1.
    mass : float
        :math:`\\sigma^2 > 0`. Default 1.
    initial_thermostat : float, optional
        :math:`\\xi_0`; defaults to ``diffusion``.
    initial_momentum : {"zero", "stationary"}
        As for :class:`~pyro_sgmcmc.SGHMC`.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_sgmcmc import SGNHT
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
    ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
    ...         pyro.sample("obs", dist.Normal(mu, 1.), obs=y[idx])
    >>> _ = pyro.set_rng_seed(0)
    >>> y = 3. + torch.randn(100)
    >>> mcmc = MCMC(SGNHT(model, step_size=0.05), num_samples=500, warmup_steps=200, disable_progbar=True)
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
        diffusion: float = 1.0,
        mass: float = 1.0,
        initial_thermostat: Optional[float] = None,
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
        self.diffusion = _non_negative(diffusion, "diffusion", "the injected-noise coefficient alpha")
        self.mass = _positive(mass, "mass")
        self.initial_thermostat = (
            self.diffusion
            if initial_thermostat is None
            else _non_negative(initial_thermostat, "initial_thermostat", "xi_0")
        )
        self.initial_momentum = _choice(initial_momentum, "initial_momentum", _INITIAL_MOMENTA)

    def _init_auxiliary(self, position: torch.Tensor):
        momentum = self._initial_momentum(position, self.initial_momentum, self.mass)
        thermostat = torch.full(
            position.shape[:-1], self.initial_thermostat, dtype=position.dtype, device=position.device
        )
        return momentum, thermostat

    def _transition(
        self, state: SGMCMCState, drift: torch.Tensor, step_size: float, noise, drift_scale: float = 1.0, out=None
    ):
        return nose_hoover_step(
            state.position,
            state.momentum,
            state.thermostat,
            drift,
            step_size,
            self.noise_temperature,
            self.diffusion,
            self.mass,
            noise,
            drift_scale,
            out,
        )

    def _auxiliary_stats(self, state: SGMCMCState) -> Dict[str, torch.Tensor]:
        return {
            "kinetic_energy": _kinetic_energy(state.momentum, self.mass),
            "thermostat": state.thermostat.clone(),
        }
