"""A run's fingerprint: everything its draws depend on, which a checkpoint must share with the run resuming it.

The fingerprint is a flat dict, so that a mismatch names the component that differs
(:func:`pyro_sgmcmc.checkpoint.load_checkpoint` lists each one): the kernel's configuration
(:meth:`~pyro_sgmcmc.kernels.base.SGMCMCKernel.configuration`, its step-size schedule included), the
latent sites, the subsampled plates, the dtype, the run's length, chains and seed, the starting
points, and the model's arguments and code, component by component
(:func:`~pyro_sgmcmc.fingerprint.model_fingerprint`: ``"argument 'data[\\"x\\"]'"``,
``"the model's code: my_module.model"``). All is by content, nothing by memory address, so that a
new process building the same run has the same fingerprint.

Computing it also refuses, before the first step, what a checkpoint could not resume faithfully: a
model argument or global whose content cannot be read (:class:`~pyro_sgmcmc.fingerprint.Unfingerprintable`)
and a schedule that keeps state it does not save (:func:`~pyro_sgmcmc.fingerprint.check_schedule_state`),
both ``TypeError``.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch

from ..fingerprint import check_schedule_state, model_fingerprint
from ..kernels.base import SGMCMCKernel
from ..kernels.configuration import tensor_digest
from .length import RunLength

__all__ = ["FINGERPRINT_VERSION", "fingerprint"]

#: The layout of the fingerprint (2: the model's arguments through containers and its code, component by component).
FINGERPRINT_VERSION = 2


def fingerprint(
    kernel: SGMCMCKernel,
    length: RunLength,
    *,
    num_chains: int,
    num_superchains: int,
    seed: Optional[int],
    chain_ids: Optional[Sequence[int]],
    initial_params: Optional[Dict[str, torch.Tensor]] = None,
) -> dict:
    """The settings a checkpoint must share with the run that resumes it: all that changes the draws (module
    docstring). Called once the model is traced and before the first step.

    Raises
    ------
    TypeError
        A model argument, or a value the model's code reads, whose content cannot be fingerprinted (named); a
        step-size schedule that keeps state without ``state_dict``/``load_state_dict``.
    """
    potential = kernel.potential
    check_schedule_state(kernel.step_size)
    return {
        "fingerprint version": FINGERPRINT_VERSION,
        "kernel": kernel.configuration(),
        "sites": [(s.name, tuple(s.unconstrained_shape)) for s in potential.sites],
        "plates": [(p.name, p.size, p.subsample_size, p.user_indices) for p in potential.subsample_plates],
        "dtype": str(potential.dtype),
        "num_data": potential.num_data,
        "num_chains": num_chains,
        "num_superchains": num_superchains,
        "warmup_steps": length.warmup_steps,
        "num_samples": length.num_samples,
        "thinning": length.thinning,
        "keep_last": length.keep_last,
        "seed": seed,
        **({} if chain_ids is None else {"chain_ids": list(chain_ids)}),
        **({} if initial_params is None else {"initial_params": tensor_digest(initial_params)}),
        **model_fingerprint(potential.model, potential.model_args, potential.model_kwargs),
    }
