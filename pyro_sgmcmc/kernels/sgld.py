"""Stochastic-gradient Langevin dynamics (Welling and Teh, 2011), tempered."""

from __future__ import annotations

import torch

from .base import SGMCMCKernel, SGMCMCState
from .diffusions import langevin_step

__all__ = ["SGLD"]


class SGLD(SGMCMCKernel):
    """Stochastic-gradient Langevin dynamics for :class:`pyro.infer.MCMC`.

    Each step re-runs the model, so every ``pyro.plate(..., subsample_size=B)`` draws a fresh
    minibatch and scales its log-likelihood by ``N / B``; the update is

    .. math:: z_{t+1} = z_t + \\epsilon_t\\, N^{-1} \\nabla \\widehat{\\log \\pi}(z_t)
              + \\sqrt{2 \\epsilon_t T / N}\\, \\zeta_t, \\qquad \\zeta_t \\sim \\mathcal{N}(0, I),

    in unconstrained space (log-det Jacobians included). The drift is normalised by ``N``, so
    ``step_size`` behaves like an SGD learning rate on the mean negative log-likelihood whatever
    ``N`` is; the noise has variance :math:`2 \\epsilon T / N`. The chain targets
    :math:`\\pi^{1/T}`: ``T = 1`` the posterior, ``0 < T < 1`` a cold posterior, ``T = 0`` gradient
    descent (exactly ``torch.optim.SGD(lr=step_size)`` on :math:`U / N`). With a constant step size
    the stationary distribution is biased by :math:`O(\\epsilon)`; a :class:`~pyro_sgmcmc.RobbinsMonro`
    schedule removes the bias asymptotically. Warmup steps are burn-in: they move the chain and
    advance the schedule but are not returned.

    Parameters
    ----------
    model : callable
        Pyro model with continuous, global latent sites.
    step_size : float, Schedule, callable or None
        :math:`\\epsilon`, positive, in units of the normalised drift (an SGD learning rate on :math:`U / N`):
        a float (constant), a :class:`~pyro_sgmcmc.Constant` or :class:`~pyro_sgmcmc.RobbinsMonro` schedule,
        or any ``t -> float`` with ``t`` the chain's step counter (warmup included; a schedule needs
        ``adapt_step_size=False``). ``None`` (default) means one thing: the default value 1e-3. With
        ``adapt_step_size=True`` (default) any given value is only where the warmup starts (and what a chain
        whose curvature cannot be measured keeps): the warmup derives one step size per chain
        (:doc:`/preconditioning`); otherwise it is used throughout.
    adapt_step_size : bool
        Pyro's name and default (True): with ``temperature > 0`` and ``warmup_steps >= 20`` the warmup first
        brings every chain to the posterior's bulk from wherever its init puts it (a sign-based descent,
        the first 25 % of warmup), then derives each chain's step size from its preconditioned curvature
        and gradient noise, halving it after a divergence (see :mod:`pyro_sgmcmc.kernels.warmup` and
        :doc:`/preconditioning`). False: the fixed ``step_size`` (or schedule) throughout.
    adapt_mass_matrix : bool
        Pyro's name and default (True): precondition the dynamics with a mass matrix adapted per chain
        during warmup from the regularised curvature at the chain's own draws, then frozen, so sampling
        targets the exact tempered posterior (see :mod:`pyro_sgmcmc.kernels.preconditioning`). A
        ``step_size`` is then in *preconditioned units* (normalised curvature about 1 in every
        direction). Nothing is adapted at ``temperature=0`` (the kernel is then an optimiser).
    full_mass : bool or None
        Dense (True) or diagonal (False) mass matrix; ``None`` (default): dense when the model has
        at most 64 unconstrained numbers (``O(dim^2)`` per step), diagonal otherwise. Only with
        ``adapt_mass_matrix=True``.
    init_strategy : callable
        A Pyro init strategy; default :func:`~pyro.infer.autoguide.initialization.init_to_uniform`.
        ``MCMC(initial_params=...)`` (unconstrained values) takes precedence.
    temperature : float
        :math:`T \\ge 0`. Default 1.
    num_data : int, optional
        :math:`N`; by default the full size of the data plate (the number of likelihood terms).
    control_variate : "auto", None, "map" or dict
        Control-variate gradients (SGLD-CV, Baker et al. 2019): each step's minibatch gradient is
        centred at a fixed point whose full-data gradient is computed once, in chunks, at set-up;
        ``"map"`` finds that point by L-BFGS on the full data, a dict gives it (constrained values
        of every latent site). Unbiased; lower gradient noise near the centre; one extra minibatch
        evaluation per step. Needs one subsampled plate. ``"auto"`` (default): ``"map"`` from the end
        of the warmup's approach when the model has one subsampled plate with ``N >= 10 B`` and an
        adaptation flag is on, otherwise none; ``None``: never. See
        :mod:`pyro_sgmcmc.kernels.control_variates`.
    init_to_centre : bool
        Start every chain at the control variate's centre (the MAP with ``"map"``), as Baker et al.
        (2019) start SGLD-CV; the chains' own initial values (``init_strategy`` or
        ``initial_params``) then only start the MAP search. Burn-in is then only the time for the
        chains to spread out from the mode, but the chains no longer start over-dispersed, so R-hat
        cannot detect a second mode. Needs ``control_variate``. Default False. (Was ``start_at_centre``.)
    on_divergence : {"restart", "freeze", "raise"}
        What to do when a step gives a non-finite potential or gradient (a *divergence*, always
        recorded in ``diagnostics()["divergences"]``): put the chain back at its last finite state
        with zero momentum and go on (``"restart"``, default), stop that chain for the rest of the
        run (``"freeze"``), or raise :class:`~pyro_sgmcmc.DivergenceError` naming the step, the
        chain and the sites (``"raise"``). Other chains are never affected.
    jit_compile : bool or "auto"
        Compile the one-chain potential and gradient with :func:`torch.jit.trace` on the first step
        (:class:`~pyro_sgmcmc.ModelPotential`'s ``jit_compile``): Pyro's per-step machinery and the
        model's Python then run once, which makes a step of a small model about 1.5-2 times cheaper.
        ``"auto"`` (the default) compiles when Pyro's validation is off (``MCMC`` turns it off), the
        model gives bit-identical results run twice on the same point and minibatch, and the compiled
        potential agrees with the model at two points; otherwise it runs the model every step, as
        ``False`` always does (use ``False`` for a model with side effects, such as reading a variable
        a hook changes). ``True`` compiles whenever the check passes and warns when it cannot.
        Vectorised chains use :func:`torch.func.vmap` and ignore it.
    cuda_graph : bool
        Record the sampling step once as a CUDA graph and replay it (:mod:`~pyro_sgmcmc.kernels.capture`): on a
        GPU a step then costs one launch instead of one per operator. Sampling only (the warmup adapts, so it
        runs eagerly); the chains and data on a CUDA device; the model must do the same operations at every
        step (no random draws of its own, no Python branch on a value), and Pyro's validation is off in the
        recorded step. The first sampling step is taken both ways and compared: a model that cannot be
        recorded, or whose replay differs, runs eagerly with a :class:`~pyro_sgmcmc.kernels.capture.CaptureFallback`
        warning saying why, as does ``cuda_graph=True`` on the CPU. The draws equal the eager ones to float
        rounding. Default False.
    gradient_estimator : callable, optional
        Your own gradient estimator, as ``gradient_estimator(potential) -> estimator``: called at set-up with the
        model's :class:`~pyro_sgmcmc.ModelPotential`; the estimator maps the ``(C, D)`` positions and the step's
        minibatch indices ``{plate: (C, B)}`` to ``(U (C,), grad U (C, D))`` (:mod:`~pyro_sgmcmc.kernels.gradients`:
        ``MinibatchGradient``, ``ControlVariate`` and ``all_reduced`` compose). It replaces the control variate
        (``control_variate`` must be None or left at "auto"). It must be unbiased for the full-data potential.

    Notes
    -----
    All arguments but ``model`` and ``step_size`` are keyword-only, in the same order in every kernel; the
    kernel's own (SGHMC's ``friction``, ...) follow them. The previous release's spellings (the arguments after
    ``step_size`` by position; ``start_at_centre``, ``initial_momentum``, ``initial_thermostat``) still work
    for this release, with a :class:`FutureWarning` naming the new one.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_sgmcmc import SGLD
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0., 10.))
    ...     with pyro.plate("data", len(y), subsample_size=10) as idx:
    ...         pyro.sample("obs", dist.Normal(mu, 1.), obs=y[idx])
    >>> _ = pyro.set_rng_seed(0)
    >>> y = 3. + torch.randn(100)
    >>> mcmc = MCMC(SGLD(model, step_size=0.01), num_samples=500, warmup_steps=200, disable_progbar=True)
    >>> mcmc.run(y)
    >>> abs(mcmc.get_samples()["mu"].mean() - y.mean()) < 0.1
    tensor(True)
    """

    def transition(self, state: SGMCMCState, drift: torch.Tensor, step_size, noise, drift_scale: float = 1.0, out=None):
        position_out = None if out is None else out[0]
        position = langevin_step(
            state.position, drift, step_size, self.noise_temperature, noise, drift_scale, position_out
        )
        return position, None, None
