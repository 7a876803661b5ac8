"""Stochastic-gradient Nose-Hoover thermostat (Ding et al., 2014), tempered."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from .adapt.stability import THERMOSTAT_CONSTANT, StabilityRule
from .arguments import INIT_MOMENTA, choice, non_negative, positive, renamed_attribute
from .base import SGMCMCKernel, SGMCMCState
from .diffusions import kinetic_energy as _kinetic_energy
from .diffusions import nose_hoover_step
from .step import nonfinite_point

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
    model, step_size, ... :
        ``model``, ``step_size`` and the keyword arguments every kernel shares (``adapt_step_size`` to
        ``jit_compile``), as for :class:`~pyro_sgmcmc.SGLD`. With a mass matrix the momentum, ``mass`` and
        ``diffusion`` are in preconditioned units.
    diffusion : float
        :math:`\\alpha \\ge 0`, the injected-noise coefficient. Default 1.
    mass : float
        :math:`\\sigma^2 > 0`. Default 1.
    init_thermostat : float, optional
        :math:`\\xi_0`; defaults to ``diffusion``.
    init_momentum : {"zero", "stationary"}
        As for :class:`~pyro_sgmcmc.SGHMC`.

    Examples
    --------
    The thermostat is a statistic of every step (one per chain), next to ``lp`` and ``kinetic_energy``:

    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_sgmcmc import MCMC, SGNHT
    >>> def scale(y):
    ...     sigma = pyro.sample("sigma", dist.LogNormal(0., 1.))
    ...     with pyro.plate("data", len(y), subsample_size=20) as i:
    ...         pyro.sample("obs", dist.Normal(0., sigma), obs=y[i])
    >>> y = 2. * torch.randn(200, generator=torch.Generator().manual_seed(1))
    >>> run = MCMC(SGNHT(scale), 300, 200, num_chains=2, chain_method="vectorized", seed=0, disable_progbar=True)
    >>> run.run(y)
    >>> run.sample_stats["thermostat"].shape, bool(abs(run.get_samples()["sigma"].mean() - y.std()) < 0.2)
    (torch.Size([2, 300]), True)
    """

    LEGACY_POSITIONAL = (
        "temperature", "num_data", "diffusion", "mass", "initial_thermostat", "initial_momentum", "init_strategy",
        "on_divergence",
    )  # fmt: skip

    def configure_dynamics(
        self,
        *,
        diffusion: float = 1.0,
        mass: float = 1.0,
        init_thermostat: Optional[float] = None,
        init_momentum: str = "zero",
    ) -> None:
        """SGNHT's own arguments (Parameters above), after the shared ones."""
        self.diffusion = non_negative(diffusion, "diffusion", "the injected-noise coefficient alpha")
        self.mass = positive(mass, "mass")
        self.init_thermostat = (
            self.diffusion if init_thermostat is None else non_negative(init_thermostat, "init_thermostat", "xi_0")
        )
        self.init_momentum = choice(init_momentum, "init_momentum", INIT_MOMENTA)

    @property
    def damping(self) -> float:
        return self.diffusion

    @staticmethod
    def stability_rule(proposed: SGMCMCState) -> torch.Tensor:
        """The chains to put back: a non-finite potential or gradient
        (:func:`~pyro_sgmcmc.kernels.step.nonfinite_point`) or a non-finite thermostat. A thermostat that overflows
        (:math:`\\xi \\mathrel{+}= h (p^\\top p / (m d) - T)` with a tiny mass) leaves the position finite for one
        more step, so the draw kept at that step would hold an infinite thermostat; two operations more a step."""
        diverging = nonfinite_point(proposed)
        if proposed.thermostat is None:
            return diverging
        return diverging | ~torch.isfinite(proposed.thermostat)

    def warmup_stability_rule(self) -> StabilityRule:
        """Second order with a thermostat (:math:`\\epsilon = 0.1 / \\sqrt{\\lambda_{max}}`: :math:`\\epsilon \\xi` must
        stay well below 2 while the thermostat fluctuates), damped by the injected noise's diffusion."""
        return StabilityRule(THERMOSTAT_CONSTANT, second_order=True, damping=self.diffusion)

    initial_momentum = renamed_attribute("initial_momentum", "init_momentum")
    initial_thermostat = renamed_attribute("initial_thermostat", "init_thermostat")

    def _init_auxiliary(self, position: torch.Tensor):
        momentum = self._initial_momentum(position, self.init_momentum, self.mass)
        thermostat = torch.full(position.shape[:-1], self.init_thermostat, dtype=position.dtype, device=position.device)
        return momentum, thermostat

    def transition(
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
