"""Pure update rules of the tempered stochastic-gradient diffusions.

All three rules discretise the tempered SDE of the seed paper (Duffield et al.,
"Scalable Bayesian Learning with posteriors")

.. math:: dz = (D + Q)\\, N^{-1} \\nabla \\log \\pi(z)\\, dt + \\sqrt{2 \\mathcal{T} D}\\, dw,
          \\qquad \\mathcal{T} = T / N,

whose stationary distribution is :math:`\\pi(z)^{1/T}`. ``drift`` below is always the
*normalised* drift :math:`N^{-1} \\nabla \\log \\pi` (minus the gradient of the potential,
divided by N), ``step_size`` is :math:`\\epsilon` and ``noise_temperature`` is
:math:`\\mathcal{T} = T / N`. ``step_size`` is a number, or a tensor of shape ``(..., 1)`` (one
step size per chain, as the warmup adapts them). ``noise`` is a standard normal draw of the position's shape,
or ``None`` when :math:`\\mathcal{T} = 0` (no noise is drawn at all). ``drift_scale`` multiplies
``drift``: a kernel passes the potential's gradient with ``drift_scale = -1/N``, which folds the
normalisation into the update's one pass instead of making a scaled copy of the gradient first. ``out``
(SGLD: the new position's buffer; SGHMC and SGNHT: the new position's and momentum's) receives the result
instead of new tensors: a kernel passes buffers of its own that nothing else refers to (see
:meth:`~pyro_sgmcmc.kernels.base.SGMCMCKernel.step`).

The functions act elementwise on tensors of any shape ``(..., dim)``; the last axis is the
parameter axis (used only by the SGNHT thermostat), the leading axes are chains. They never
modify their inputs.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

__all__ = ["langevin_step", "underdamped_step", "nose_hoover_step", "kinetic_energy"]


def langevin_step(
    position: torch.Tensor,
    drift: torch.Tensor,
    step_size: float,
    noise_temperature: float,
    noise: Optional[torch.Tensor],
    drift_scale: float = 1.0,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One SGLD step (overdamped Langevin, :math:`D = I`, :math:`Q = 0`).

    .. math:: z' = z + \\epsilon\\, N^{-1} \\nabla \\log \\pi(z) + \\sqrt{2 \\epsilon \\mathcal{T}}\\, \\zeta

    At :math:`\\mathcal{T} = 0` this is gradient descent on :math:`N^{-1} U` with learning rate
    :math:`\\epsilon`.
    """
    # fused: each line is one pass over the new tensor (the inputs are never modified)
    new_position = _add_scaled(position, drift, step_size * drift_scale, _checked_out(out, position, "position"))
    if noise is not None:
        _add_scaled_(new_position, noise, _sqrt(2.0 * step_size * noise_temperature))
    return new_position


def underdamped_step(
    position: torch.Tensor,
    momentum: torch.Tensor,
    drift: torch.Tensor,
    step_size: float,
    noise_temperature: float,
    friction: float,
    mass: float,
    noise: Optional[torch.Tensor],
    drift_scale: float = 1.0,
    out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One SGHMC step (underdamped Langevin), momentum first, then position with the new momentum.

    .. math::
        m' &= m + \\epsilon\\, N^{-1} \\nabla \\log \\pi(z) - \\epsilon \\alpha\\, m / \\sigma^2
              + \\sqrt{2 \\epsilon \\mathcal{T} \\alpha}\\, \\zeta \\\\
        z' &= z + \\epsilon\\, m' / \\sigma^2

    with friction :math:`\\alpha` and mass :math:`\\sigma^2`. This is the symplectic-Euler order
    that PyTorch's SGD uses, so at :math:`\\mathcal{T} = 0` the trajectory equals
    ``torch.optim.SGD(lr=eps / sigma^2, momentum=1 - eps * alpha / sigma^2, dampening=1 - eps)`` on
    :math:`N^{-1} U` step for step, with PyTorch's momentum buffer equal to :math:`-m`.
    """
    decay = 1.0 - step_size * friction / mass
    noise_scale = _sqrt(2.0 * step_size * noise_temperature * friction)
    return _kick_then_move(
        position, momentum, decay, drift, step_size * drift_scale, noise, noise_scale, step_size / mass, out
    )


def nose_hoover_step(
    position: torch.Tensor,
    momentum: torch.Tensor,
    thermostat: torch.Tensor,
    drift: torch.Tensor,
    step_size: float,
    noise_temperature: float, diffusion: float, mass: float,
    noise: Optional[torch.Tensor],
    drift_scale: float = 1.0,
    out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """One SGNHT step (stochastic-gradient Nose-Hoover thermostat, Ding et al. 2014).

    .. math::
        m' &= m + \\epsilon\\, N^{-1} \\nabla \\log \\pi(z) - \\epsilon \\xi\\, m / \\sigma^2
              + \\sqrt{2 \\epsilon \\mathcal{T} \\alpha}\\, \\zeta \\\\
        z' &= z + \\epsilon\\, m' / \\sigma^2 \\\\
        \\xi' &= \\xi + \\epsilon \\left( \\frac{m' \\cdot m'}{\\sigma^2 d} - \\mathcal{T} \\right)

    The thermostat :math:`\\xi` (one per chain, shape ``position.shape[:-1]``) adapts the friction
    until the kinetic temperature :math:`m \\cdot m / (\\sigma^2 d)` equals :math:`\\mathcal{T}`,
    absorbing unknown gradient noise. :math:`\\alpha` (``diffusion``) sets the injected noise.
    ``out`` (new position, new momentum) are buffers to write into, as in :func:`underdamped_step`;
    the thermostat, one number per chain, is always a new tensor.
    """
    # the thermostat's friction: a per-chain decay 1 - eps xi / sigma^2, shape (..., 1)
    decay = 1.0 - (step_size / mass) * thermostat.unsqueeze(-1)
    noise_scale = _sqrt(2.0 * step_size * noise_temperature * diffusion)
    new_position, new_momentum = _kick_then_move(
        position, momentum, decay, drift, step_size * drift_scale, noise, noise_scale, step_size / mass, out
    )
    # m' . m' per chain as a batched dot product: no chain-sized temporary
    kinetic_temperature = torch.einsum("...i,...i->...", new_momentum, new_momentum) / (mass * position.shape[-1])
    per_chain = step_size.squeeze(-1) if torch.is_tensor(step_size) else step_size
    new_thermostat = thermostat + per_chain * (kinetic_temperature - noise_temperature)
    return new_position, new_momentum, new_thermostat


def _kick_then_move(
    position: torch.Tensor,
    momentum: torch.Tensor,
    decay,
    drift: torch.Tensor,
    drift_alpha: float,
    noise: Optional[torch.Tensor],
    noise_alpha: float,
    move_alpha: float,
    out: Optional[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]],
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The update SGHMC and SGNHT share: ``m' = decay * m + drift_alpha * drift + noise_alpha * noise``, then
    ``z' = z + move_alpha * m'`` (``decay`` a number, or a per-chain tensor that broadcasts). Fused: each
    line is one pass over the new tensor, written into ``out = (position buffer, momentum buffer)`` where
    given; the inputs are never modified."""
    out_position, out_momentum = (None, None) if out is None else out
    out_position = _checked_out(out_position, position, "position")
    out_momentum = _checked_out(out_momentum, momentum, "momentum")
    new_momentum = momentum.mul(decay) if out_momentum is None else torch.mul(momentum, decay, out=out_momentum)
    _add_scaled_(new_momentum, drift, drift_alpha)
    if noise is not None:
        _add_scaled_(new_momentum, noise, noise_alpha)
    return _add_scaled(position, new_momentum, move_alpha, out_position), new_momentum


def _checked_out(buffer: Optional[torch.Tensor], like: torch.Tensor, what: str) -> Optional[torch.Tensor]:
    """``buffer`` if it can hold the new ``what`` (same shape, dtype and device as ``like``), else an error:
    ``torch``'s ``out=`` would resize or refuse it less clearly."""
    if buffer is not None and (
        buffer.shape != like.shape or buffer.dtype != like.dtype or buffer.device != like.device
    ):
        raise ValueError(
            f"out: the new {what}'s buffer must match the {what} (shape {tuple(like.shape)}, {like.dtype}, "
            f"{like.device}); got shape {tuple(buffer.shape)}, {buffer.dtype}, {buffer.device}"
        )
    return buffer


def _add_scaled(
    base: torch.Tensor, other: torch.Tensor, alpha: float, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``base + alpha * other`` as a new tensor (or written into ``out``, a tensor no one else holds), in
    one pass (an ``alpha`` beyond the dtype's range, which ``torch.add`` refuses, takes the two-pass form
    and overflows to inf as plain arithmetic does). A tensor ``alpha`` (per-chain ``(C, 1)``) broadcasts."""
    if torch.is_tensor(alpha):
        return torch.addcmul(base, other, alpha) if out is None else torch.addcmul(base, other, alpha, out=out)
    if math.isfinite(alpha) and abs(alpha) > torch.finfo(base.dtype).max:
        result = base + alpha * other
        return result if out is None else out.copy_(result)
    return torch.add(base, other, alpha=alpha) if out is None else torch.add(base, other, alpha=alpha, out=out)


def _add_scaled_(out: torch.Tensor, other: torch.Tensor, alpha: float) -> torch.Tensor:
    """``out += alpha * other`` in place (``out`` is a tensor made by the caller), as :func:`_add_scaled`."""
    if torch.is_tensor(alpha):
        return out.addcmul_(other, alpha)
    if math.isfinite(alpha) and abs(alpha) > torch.finfo(out.dtype).max:
        return out.add_(alpha * other)
    return out.add_(other, alpha=alpha)


def _sqrt(value):
    """``sqrt`` of a number or, elementwise, of a tensor (per-chain step sizes)."""
    return value.sqrt() if torch.is_tensor(value) else math.sqrt(value)


def kinetic_energy(momentum: torch.Tensor, mass: float) -> torch.Tensor:
    """:math:`m \\cdot m / (2 \\sigma^2)` per chain, in float64 (finite wherever the momentum is)."""
    scaled = momentum.double() / math.sqrt(mass)
    return (scaled * scaled).sum(-1) / 2
