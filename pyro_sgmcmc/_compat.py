"""Every use of a private torch or Pyro member, in one place.

The rest of the package reads only public names. Each entry here says which private member it
reads, what the public alternative is, and the measured gain that keeps it (or why no public
alternative exists). Nothing here changes a process-wide state: no monkeypatch, no allocator
settings; each function reads or calls, and returns.

Sections, one a room, so that a change to one room's needs touches one block.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------- model room
# (pyro_sgmcmc.model)
#
# 1. ``torch._C``'s module ``_functorch`` (is_batchedtensor, is_functorch_wrapped_tensor, get_unwrapped):
#    whether a tensor met inside ``torch.func.vmap`` / ``torch.func.grad`` carries a vmapped (chain)
#    dimension or depends on the differentiated input at some level. Public alternative: none (``torch.func``
#    has no such query); without it a prior's parameters cannot be told constant, so the Normal priors of
#    ``pyro_sgmcmc.model.priors`` (one product of the flat position with itself) must be switched off and
#    every site evaluated through ``Normal.log_prob``. Gain, measured (2 cores, one thread, the 64-40-10
#    MLP of benchmarks/vectorized_chains.py, 3,010 weights in 4 sites, CPU time per call, best of 7):
#    one chain ``potential_and_grad`` 0.51-0.64 ms against 0.82-1.03 ms without (1.6x); 256 chains
#    ``batched_potential_and_grad`` 19.3-20.0 ms against 23.9-25.1 ms (1.2-1.3x).
#    Not kept: the tensor attribute ``_base`` (to read the one value of ``Normal(0., 1.).expand(shape)``'s
#    zero-stride parameters): measured 0.44 against 1.09 us per call of ``constant_scalar`` through the
#    public path (``as_strided((), ())``), 2 calls per prior site and step, i.e. 2.6 us of a 500 us step of
#    the 4-site MLP: 0.5 %, not worth a private read.
import torch  # noqa: E402  (each room's imports sit in its own section)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402  (the base of EagerDispatchMode)

_functorch = torch._C._functorch


def is_batched(tensor: torch.Tensor) -> bool:
    """True inside :func:`torch.func.vmap` for a tensor with a vmapped (chain) dimension, at any level."""
    while True:
        if _functorch.is_batchedtensor(tensor):
            return True
        if not _functorch.is_functorch_wrapped_tensor(tensor):
            return False
        tensor = _functorch.get_unwrapped(tensor)


def unwrapped_constant(tensor: torch.Tensor) -> torch.Tensor | None:
    """The plain tensor under ``torch.func``'s wrappers if ``tensor`` depends on no input of the evaluation
    (not differentiated at any level, no vmapped dimension), else ``None``. Tensors made inside
    :func:`torch.func.grad` are wrapped for it but do not require grad."""
    while True:
        if tensor.requires_grad or _functorch.is_batchedtensor(tensor):
            return None
        if not _functorch.is_functorch_wrapped_tensor(tensor):
            return tensor
        tensor = _functorch.get_unwrapped(tensor)


# ---------------------------------------------------------------------------- kernels room
# (pyro_sgmcmc.kernels)
# Nothing: the kernels read no private torch or Pyro member. The buffer reuse of large chains (a step's position
# and momentum written into the memory of the state of two steps back, once torch._C._storage_Use_Count said no
# one else held it, and tensor._base said it was no view) was removed: re-measured with
# benchmarks/kernel_steps.py (small MLP, 256 chains, float32 positions of about 3 MB, interleaved runs of the previous
# and this version on the shared machine) a step took 31.5-34.5 ms with it and 32.9-33.1 ms without (SGLD; SGHMC
# 33.2-34.9 vs 31.2-35.4): no gain above the noise of the measurement, for two private reads.


# ---------------------------------------------------------------------------- guides room
# (pyro_sgmcmc.guides)
#
# 1. ``MaskedDistribution._mask``. ``dist.mask(mask)`` keeps its mask in a private attribute and
#    offers no public accessor; the GGN rows of a masked likelihood must zero the masked
#    elements of the whitened outputs (not only of ``log_prob``). Public alternative: none that
#    recovers the mask (``log_prob == 0`` confuses masked elements with zero densities). Gain:
#    the exact GGN of ``poutine.mask``/``.mask()`` likelihoods, tested in tests/guides.


def distribution_mask(fn):
    """The mask of a :class:`pyro.distributions.MaskedDistribution` (a bool or a bool tensor)."""
    return fn._mask


# 2. Pyro's ``AutoContinuous`` guides: the one adapter to their private members, :class:`AutoGuideInternals`.
#    ``LaplaceApproximation`` (a subclass of ``AutoContinuous``) and ``AutoDiagVI`` (of ``AutoDiagonalNormal``)
#    touch Pyro's guide internals only through it; everything else they need is public (``prototype_trace``,
#    ``latent_dim``, ``loc``, ``get_posterior``; the layout is recomputed from the prototype trace by
#    ``pyro_sgmcmc.guides.sites``). What Pyro's own methods need from a subclass, and what each costs:
#
#    a. ``_prototype_frames``, ``_unconstrained_shapes``, ``_cond_indep_stacks`` (written):
#       ``AutoContinuous.forward``, ``median`` and ``quantiles`` (through ``_unpack_latent`` and
#       ``_create_plates``) read the layout of the latent vector from these three dicts, which only the private
#       ``_setup_prototype(*args, **kwargs)`` fills, by tracing the model. A ``LaplaceApproximation`` is built
#       from a trace it is handed (a subset of the MAP guide's sites when ``subset_of_weights`` holds some at
#       the MAP), not from a run of the model, so it writes the same three dicts from that trace. Public
#       alternative: none (Pyro has no constructor from a trace); re-implementing ``forward``, ``median`` and
#       ``quantiles`` would copy about 80 lines of Pyro. Cost: three writes whose names and meaning a Pyro
#       release may change (Pyro 1.8 and 1.9 have them as written here); tests/guides fail at once if they
#       do (every sampling, median and quantile test of ``LaplaceApproximation`` goes through them).
#    b. ``_pyro_name`` (read, of ``PyroModule``): ``AutoContinuous.sample_latent`` names its auxiliary site
#       ``"_{_pyro_name}_latent"``; ``AutoDiagVI``'s sticking-the-landing draw must use the same name, or a
#       trained guide's site would change name with the option. Public alternative: none (``PyroModule`` has
#       no accessor; the class name differs from ``_pyro_name`` once the guide is a submodule). Cost: one read.
#
#    The guides also *implement* one of ``AutoContinuous``'s private hooks, ``_loc_scale`` (the MAP and a zero
#    scale in ``AutoLaplace``; the mean and marginal standard deviations in ``LaplaceApproximation``), because
#    Pyro's public ``median`` and ``quantiles`` call it; no module of the package calls it. The model checks that
#    ``AutoLaplace`` and ``AutoDiagVI`` made in ``_setup_prototype`` now run in their public ``forward``,
#    before Pyro's, on the first call.


class AutoGuideInternals:
    """The private members of Pyro's ``AutoContinuous`` / ``PyroModule`` that the package's guides need (entry 2)."""

    @staticmethod
    def set_layout(guide, prototype_trace, unconstrained_shapes) -> None:
        """Give ``guide`` the latent layout of ``prototype_trace`` as ``AutoContinuous._setup_prototype`` would (2a).

        ``unconstrained_shapes`` is ``{site: shape}`` in model order
        (:func:`pyro_sgmcmc.guides.sites.unconstrained_shapes` of the trace).
        """
        latent = list(prototype_trace.iter_stochastic_nodes())
        guide._prototype_frames = {
            frame.name: frame for _, site in latent for frame in site["cond_indep_stack"] if frame.vectorized
        }
        guide._unconstrained_shapes = dict(unconstrained_shapes)
        guide._cond_indep_stacks = {name: site["cond_indep_stack"] for name, site in latent}

    @staticmethod
    def latent_site_name(guide) -> str:
        """The name of the auxiliary site of ``AutoContinuous.sample_latent``, ``"_<module name>_latent"`` (2b)."""
        return f"_{guide._pyro_name}_latent"


# ---------------------------------------------------------------------------- run room
# (pyro_sgmcmc.mcmc, pyro_sgmcmc.export, pyro_sgmcmc.distributed, pyro_sgmcmc.diagnostics)
#
# 1. ``TorchDispatchMode._should_skip_dynamo`` (overridden, not read): ``TorchDispatchMode.__init_subclass__``
#    wraps a subclass's ``__torch_dispatch__`` in ``torch._disable_dynamo``, whose first call imports
#    ``torch._dynamo`` (1.1 s of CPU on the 2-core machine, measured, against an export of issue 26's case of about
#    1 s); a subclass whose ``_should_skip_dynamo`` returns False is left unwrapped, as that method's docstring
#    describes. Public alternative: none (a classmethod ``__torch_dispatch__`` keeps no state per recording).
#    Used by the export's operator recorder (:mod:`pyro_sgmcmc.export.replay`) and the capture's host-read check
#    (:mod:`pyro_sgmcmc.kernels.capture`), which compile nothing.


class EagerDispatchMode(TorchDispatchMode):
    """A :class:`TorchDispatchMode` base whose subclasses' ``__torch_dispatch__`` is not wrapped for Dynamo (entry
    1 of the run room): entering one does not import ``torch._dynamo``."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


# ---------------------------------------------------------------------------- kernels room: the MAP search
# (pyro_sgmcmc.kernels.control_variates)
def eager_lbfgs(params, **options) -> torch.optim.LBFGS:
    """:class:`torch.optim.LBFGS` whose construction does not import ``torch._dynamo`` (and sympy).

    Implementation detail read: torch wraps :meth:`torch.optim.Optimizer.add_param_group` (and ``zero_grad``)
    in ``torch._disable_dynamo``, which imports ``torch._dynamo`` at its first call; the wrapped function is its
    ``__wrapped__`` (set by :func:`functools.wraps`). Public alternative: the optimiser as it is, which put
    ``torch._dynamo`` and sympy on the first run's path of every default SG-MCMC run (the control variate's
    MAP search): measured here (torch 2.13, 2 cores, one thread) 2.9-3.5 s of a 6.1-6.6 s first run of a
    3-parameter regression. The optimiser's arithmetic is unchanged (the same function, without dynamo's
    guard, which only matters under ``torch.compile``). Callers clear gradients themselves (``zero_grad`` is
    wrapped too). Where a torch release stops wrapping it, the plain method is used.
    """

    return _EagerLBFGS(params, **options)


class _EagerLBFGS(torch.optim.LBFGS):
    """:class:`torch.optim.LBFGS` with the optimiser's own ``add_param_group``, not torch's dynamo-guarded wrapper
    (:func:`eager_lbfgs`)."""

    add_param_group = getattr(
        torch.optim.Optimizer.add_param_group, "__wrapped__", torch.optim.Optimizer.add_param_group
    )


def pyro_chain_diagnostics(mcmc) -> list:
    """Per chain, the kernel's diagnostics that a :class:`pyro.infer.MCMC` run kept (``divergences``, ...).

    Private member: the ``_diagnostics`` list of a :class:`pyro.infer.MCMC`. Public alternative:
    ``mcmc.diagnostics()``, which returns them as ``{"divergences": {"chain c": [...]}}`` but first
    computes ``n_eff`` with
    :func:`pyro.ops.stats.effective_sample_size`, whose ``(n, n)`` mask grows quadratically: measured
    here (torch 2.13, Pyro 1.9.2, one chain of 3 parameters) +1.9 GB peak memory at 20,000 draws, so
    about 48 GB at 100,000, against nothing for this read. Used for runs of Pyro's own MCMC class:
    the one ``pyro_sgmcmc.MCMC(chain_method="parallel")`` holds (read once after its run, into its
    own ``Draws``) and one given to ``to_inference_data``.
    """
    return list(mcmc._diagnostics)


def observe_pyro_sampler(mcmc, wrap):
    """Let ``wrap(sampler)`` stand in for the sampler of a :class:`pyro.infer.MCMC`, to see each draw as it passes;
    return it.

    Member: ``sampler``, a public but undocumented attribute of :class:`pyro.infer.MCMC` (its ``_UnarySampler`` or
    ``_MultiSampler``), whose ``run(*args, **kwargs)`` yields ``(value, chain)``: per chain the ``{site: shape}``
    structure, one flat draw per sampling step, then the kernel's diagnostics; ``MCMC.run`` also calls its
    ``terminate``. Public alternative: none; ``MCMC.run`` keeps the draws in a local list, lost when the run is
    interrupted, and ``hook_fn`` runs in the worker processes when the chains run in parallel. Gain: an
    interrupted ``chain_method="parallel"`` run keeps its draws (:mod:`pyro_sgmcmc.run.pyro_chains`; Pyro 1.8
    and 1.9 have this protocol, and ``tests/run/test_partial.py`` fails at once if it changes).
    """
    mcmc.sampler = wrapped = wrap(mcmc.sampler)
    return wrapped


def exit_without_finalisation(status: int = 0) -> None:
    """End this process at once, skipping the interpreter's finalisation (the launcher's ranks).

    Private member: the ``_exit`` function of :mod:`os`. Public alternative: returning (or
    ``sys.exit``), which runs the interpreter's finalisation; with torch 2.13 and gloo a process
    that used collectives then
    sometimes aborts (``terminate called without an active exception``, SIGABRT) after its work is
    done and its process group destroyed, and :func:`pyro_sgmcmc.distributed.launch` would report a
    failed rank. No public call skips finalisation; the gain is a launch that does not fail at
    random, not speed. Everything worth keeping must be written and flushed before the call.
    """
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
