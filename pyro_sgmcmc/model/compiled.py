"""The potential compiled: one chain by ``torch.jit.trace``, many chains or minibatches by ``torch.func.vmap``.

Every evaluation of the plain potential runs the model's Python and Pyro's handlers. Two ways avoid
repeating that work:

* **one chain** (:func:`compile_potential`): :func:`torch.jit.trace` records the tensor operations of
  :math:`z, \\mathcal{B} \\mapsto U(z; \\mathcal{B})` once and replays them, as
  ``pyro.infer.HMC(jit_compile=True)`` does. It is checked against the plain potential at two points
  (the example point, and a moved point with other indices) before it is used;
* **many chains** (:meth:`Vectorized.over_chains`): the model runs once under :func:`torch.func.vmap`
  for a batch of positions ``(C, dim)``, each with its own minibatch; the gradient of
  :math:`\\sum_c U_c` holds each chain's gradient in its row (the chains are independent);
* **many minibatches at one point** (:meth:`Vectorized.over_minibatches`):
  :math:`\\sum_k U(z; \\mathcal{B}_k)` and its gradient, with :math:`z` shared (not batched), for
  full-data passes.

A model that cannot run under vmap (``.item()``, data-dependent control flow) is evaluated one by one;
an out-of-memory error says nothing about the model and is raised, never taken as that.
"""

from __future__ import annotations

import warnings
from typing import Callable, List, Literal, Mapping, Optional, Tuple, Union

import pyro
import torch
from pyro.poutine.util import is_validation_enabled

__all__ = ["JitMode", "Vectorized", "check_jit_compile", "compile_potential", "value_and_grad"]

#: ``jit_compile``'s accepted values (see :class:`~pyro_sgmcmc.model.potential.ModelPotential`).
JitMode = Union[bool, Literal["auto"]]

Potential = Callable[..., torch.Tensor]


def check_jit_compile(jit_compile: object) -> JitMode:
    """``jit_compile`` itself if it is True, False or ``"auto"``; a TypeError naming it otherwise."""
    if isinstance(jit_compile, bool) or jit_compile == "auto":
        return jit_compile  # type: ignore[return-value]
    raise TypeError(f'jit_compile must be True, False or "auto"; got {jit_compile!r}')


def value_and_grad(
    potential: Potential, position: torch.Tensor, plate_indices: List[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(U(z), dU/dz)``, detached, for a single-chain potential ``U(z, *plate_indices)``."""
    with torch.enable_grad():
        z = position.detach().requires_grad_(True)
        value = potential(z, *plate_indices)
        (grad,) = torch.autograd.grad(value, z, allow_unused=True)
    if grad is None:  # a potential that does not depend on the position
        grad = torch.zeros_like(position)
    return value.detach().to(position.dtype), grad


def compile_potential(
    potential: Potential, position: torch.Tensor, example: List[torch.Tensor], automatic: bool
) -> Tuple[Optional[Callable], Optional[str]]:
    """Trace ``potential(z, *plate_indices)`` at ``position`` and ``example`` indices with
    :func:`torch.jit.trace`; return ``(compiled, None)``, or ``(None, why)`` when tracing or the two-point
    check fails. With ``automatic`` (``jit_compile="auto"``) it also declines, returning ``(None, None)``
    (decided again later), while Pyro's validation is on or the potential is not finite at ``position``,
    and fails for a model whose repeated evaluation is not bit-identical (random numbers in the model)."""
    if automatic and is_validation_enabled():
        return None, None  # validation may be switched off later
    try:
        at_example = value_and_grad(potential, position, example)
        if automatic:
            if not all(bool(torch.isfinite(t).all()) for t in at_example):
                return None, None  # e.g. an initial point being tried: decided at a finite one
            again = value_and_grad(potential, position, example)
            if not all(torch.equal(a, b) for a, b in zip(at_example, again)):
                raise RuntimeError("the model gives different results on the same point and minibatch")
        with pyro.validation_enabled(False), warnings.catch_warnings(), torch.enable_grad():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            # torch (2.13 here) marks torch.jit.trace deprecated; it still works, and if it is ever removed
            # the AttributeError lands in the fallback below
            warnings.filterwarnings("ignore", message=".*torch.jit.trace.*deprecated", category=DeprecationWarning)
            compiled = torch.jit.trace(potential, (position.detach().requires_grad_(True), *example), check_trace=False)
        moved = position.detach() + 0.01 * torch.linspace(-1, 1, position.numel(), dtype=position.dtype)
        flipped = [i.flip(0) for i in example]
        for z, plate_indices, expected in ((position, example, at_example), (moved, flipped, None)):
            expected = expected or value_and_grad(potential, z, plate_indices)
            got = value_and_grad(compiled, z, plate_indices)
            for a, b in zip(expected, got):
                # relative to the largest entry: float32 round-off in a gradient of size 1e5 is ~1e-2
                # on every entry, however small the entry itself
                scale = float(b.abs().max()) if bool(torch.isfinite(b).all()) and b.numel() else 0.0
                if not torch.allclose(a, b, rtol=0.0, atol=1e-5 + 1e-4 * scale, equal_nan=True):
                    raise RuntimeError("the compiled potential disagrees with the model at a second point")
    except Exception as error:  # any tracing failure: the caller keeps the plain potential
        return None, (str(error).splitlines()[0] if str(error) else type(error).__name__)
    return compiled, None


class Vectorized:
    """A single-chain potential ``U(z, indices)`` vectorised with :func:`torch.func.vmap` (built lazily).

    :attr:`vectorizable` and :attr:`summable` turn False, for good, once the model fails to run under
    vmap over chains or over minibatches; the callers then evaluate one by one.
    """

    def __init__(self, potential: Callable[[torch.Tensor, Mapping[str, torch.Tensor]], torch.Tensor]) -> None:
        self.potential = potential
        self.vectorizable = True
        self.summable = True
        self._over_chains: Optional[Callable] = None
        self._over_minibatches: Optional[Callable] = None

    def over_chains(
        self, positions: torch.Tensor, indices: Mapping[str, torch.Tensor]
    ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """``(U, dU/dz)`` of ``(C,)`` and ``(C, dim)`` for positions ``(C, dim)`` and indices ``(C, B)``;
        ``None`` (with a warning, once) when the model cannot run under vmap."""
        if not self.vectorizable:
            return None
        if self._over_chains is None:
            # the forward pass under vmap, the backward by plain autograd: the chains are independent, so
            # the gradient of the sum of their potentials holds each chain's gradient in its row. Bit for
            # bit what vmap(grad_and_value) gives, and 5-7 % faster at 256 chains of a 3k-weight MLP
            self._over_chains = torch.func.vmap(self.potential, in_dims=(0, 0), randomness="different")
        try:
            with pyro.validation_enabled(False), torch.enable_grad():
                z = positions.detach().requires_grad_(True)
                potential = self._over_chains(z, dict(indices))
                (grad,) = torch.autograd.grad(potential.sum(), z, allow_unused=True)
        except RuntimeError as error:  # e.g. .item() or data-dependent control flow in the model
            if out_of_memory(error):  # not a property of the model: never a reason to give up vmap
                raise
            self.vectorizable = False
            warnings.warn(
                f"the model cannot run under torch.func.vmap ({str(error).splitlines()[0]}); "
                "chains are evaluated one by one, which is slower (chain_method='vectorized')",
                RuntimeWarning,
            )
            return None
        if grad is None:  # a potential that does not depend on the position
            grad = torch.zeros_like(positions)
        return potential.detach().to(positions.dtype), grad

    def over_minibatches(
        self, position: torch.Tensor, indices: Mapping[str, torch.Tensor]
    ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """``(sum_k U_k(z), sum_k dU_k/dz)`` for one position ``(dim,)`` and indices ``(K, B)``; ``None``
        when the model cannot share ``z`` across the minibatches."""
        if not self.summable:
            return None
        if self._over_minibatches is None:
            self._over_minibatches = torch.func.vmap(self.potential, in_dims=(None, 0), randomness="different")
        try:
            # the gradient by autograd through vmap, not torch.func.grad_and_value: that imports torch._dynamo and
            # with it sympy (seconds, at the first call of a process)
            with pyro.validation_enabled(False), torch.enable_grad():
                z = position.detach().requires_grad_(True)
                potential = self._over_minibatches(z, dict(indices)).sum()
                (grad,) = torch.autograd.grad(potential, z, allow_unused=True)
            if grad is None:  # a potential that does not depend on the position
                grad = torch.zeros_like(position)
        except RuntimeError as error:  # e.g. data-dependent control flow: the caller falls back to copies of z
            if out_of_memory(error):
                raise
            self.summable = False
            return None
        return potential.detach().to(position.dtype), grad.detach()


def out_of_memory(error: RuntimeError) -> bool:
    """An allocation failure (CUDA's ``OutOfMemoryError``, or the CPU allocator's ``RuntimeError``): it says
    nothing about whether the model can run vectorised, so it must reach the user, not switch vmap off."""
    return isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error)
