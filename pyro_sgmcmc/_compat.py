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
# 1. ``torch._C._functorch`` (is_batchedtensor, is_functorch_wrapped_tensor, get_unwrapped): whether a tensor
#    met inside ``torch.func.vmap`` / ``torch.func.grad`` carries a vmapped (chain) dimension or depends on
#    the differentiated input at some level. Public alternative: none; ``torch.func`` has no query for it.
#    Without it a prior's parameters could not be told constant, and every latent site would be evaluated
#    through ``Normal.log_prob`` under vmap instead of one product of the flat position with itself
#    (pyro_sgmcmc.model.priors). Gain, measured (2 cores, one thread, ``batched_potential_and_grad``, 256
#    chains of a 3,151-weight MLP, 4 sites, standard priors on against off): see MODEL_PRIORS_GAIN below.
# 2. ``Tensor._base``: the tensor a view was made from. ``dist.Normal(0., 1.).expand(shape)`` holds
#    zero-stride views of 0-d tensors; reading ``_base`` recognises the one value without indexing.
#    Public alternative: ``tensor.as_strided((), ())`` after the stride checks (the general path of
#    ``constant_scalar``, kept for every other tensor). Gain: see MODEL_BASE_GAIN below.
import torch  # noqa: E402  (each room's imports sit in its own section)

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


def plain_view_base(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor that ``tensor`` is a view of (``Tensor._base``), for a tensor that is neither differentiated
    nor wrapped by a ``torch.func`` transform; ``None`` otherwise or when it is not a view."""
    if tensor.requires_grad or _functorch.is_functorch_wrapped_tensor(tensor):
        return None
    return tensor._base
