r"""The linear-layer route: diagonal curvatures and K-FAC factors of networks of ``F.linear`` layers.

When every latent site is the weight or bias of one ``F.linear`` call on a ``(batch, in)`` input
(a ``PyroModule`` network with ``PyroSample`` weights), the layer calls are recorded with a
:class:`torch.overrides.TorchFunctionMode` (:class:`LinearRecorder`) and, for :math:`z_n = W a_n`,
the per-example gradient :math:`\delta_n a_n^\top` never needs forming:
:math:`\sum_n (\delta_n a_n^\top)^{\circ 2} = (\delta \circ \delta)^\top (a \circ a)`, one backward pass per
output column. The first four examples are checked against the per-example route
(:mod:`~pyro_sgmcmc.guides.curvature.per_example`); a mismatch (a site used outside the layers,
examples that interact as in batch norm) sends the sweep there instead.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import pyro
import pyro.poutine as poutine
import torch

from ...model.potential import SubsamplePlate
from .kfac import kron_chunk, kron_factors
from .kinds import Curvature, LikelihoodCurvature
from .per_example import chunk_curvature
from .rows import check_ggn_sites, keep_scales, masked_log_prob, observed_sites, site_rows, site_weight, trace_at
from .walk import chunks, progress, site_values

__all__ = ["LinearRecorder", "linear_sweep", "full_data_plate"]


class LinearRecorder(torch.overrides.TorchFunctionMode):
    """Record every ``F.linear(input, weight, bias)`` whose weight or bias is a latent site value."""

    def __init__(self, names_by_id: Dict[int, str]) -> None:
        super().__init__()
        self.names_by_id = names_by_id
        self.calls: List[tuple] = []
        self.other_uses: set = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.nn.functional.linear:
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            weight_name = self.names_by_id.get(id(weight))
            bias_name = self.names_by_id.get(id(bias)) if bias is not None else None
            if weight_name is not None or bias_name is not None:
                self.calls.append((weight_name, bias_name, args[0], out))
        return out


def _layers_cover(potential, recorder, batch: int) -> bool:
    """Is every site the weight or bias of exactly one ``F.linear`` call on a ``(batch, in)`` input?"""
    used = []
    for weight_name, bias_name, inputs, out in recorder.calls:
        if inputs.dim() != 2 or inputs.shape[0] != batch or out.dim() != 2:
            return False
        used += [n for n in (weight_name, bias_name) if n is not None]
    return sorted(used) == sorted(potential.site_names) and all(not s.has_jacobian for s in potential.sites)


def _linear_chunk(potential, position, index, keep, plate_name, kind, num_mc_samples, keep_scale, monte_carlo_fisher):
    r"""Diagonal curvature of one chunk from layer inputs and output gradients, or ``None``.

    For a weight used as ``z_n = W a_n`` the per-example gradient is :math:`\delta_n a_n^\top` with
    :math:`\delta_n = \partial r_n / \partial z_n`, so :math:`\sum_n (\delta_n a_n^\top)^2 =
    (\delta \circ \delta)^\top (a \circ a)`, one matrix product: no per-example gradient is formed.
    Only the examples ``index[keep]`` count (the others are overlaps with an earlier chunk).
    """
    latent_names = set(potential.site_names)
    with torch.enable_grad():
        leaves = [v.detach().clone().requires_grad_(True) for v in site_values(potential, position)]
        values = [site.transform(u) for site, u in zip(potential.sites, leaves)]
        recorder = LinearRecorder({id(v): site.name for site, v in zip(potential.sites, values)})
        data = {plate_name: index, **{site.name: v for site, v in zip(potential.sites, values)}}
        with recorder:
            trace = poutine.trace(poutine.condition(potential.model, data=data)).get_trace(
                *potential.model_args, **potential.model_kwargs
            )
        batch = index.shape[0]
        if not _layers_cover(potential, recorder, batch):
            return None
        rows, loglik = [], position.new_zeros(())
        for site in observed_sites(trace, latent_names):
            frames = [f for f in site["cond_indep_stack"] if f.name == plate_name]
            log_prob = masked_log_prob(site)
            if not frames or log_prob.dim() + frames[0].dim != 0:  # the plate must be the leading batch dim
                return None
            weight = float(site_weight(site))
            counted = keep.to(log_prob.dtype)
            loglik = loglik + weight * (log_prob.reshape(batch, -1).sum(-1) * counted).sum()
            lines = site_rows(site, kind, num_mc_samples, keep_scale.get(site["name"], False), monte_carlo_fisher)
            lines = math.sqrt(weight) * lines.reshape(batch, -1) * counted.unsqueeze(-1)
            rows.append(lines.sum(-1, keepdim=True) if kind is Curvature.DIAG_EF else lines)
        rows = torch.cat(rows, dim=-1)
        if kind is Curvature.DIAG_EF:
            rows = rows.sum(-1, keepdim=True)
        outputs = [out for _, _, _, out in recorder.calls]
        if kind is Curvature.KRON:
            return kron_chunk(recorder, rows, outputs, keep), loglik.detach()
        diag = {name: torch.zeros_like(v) for name, v in zip(potential.site_names, values)}
        # delta[k, n] = d rows[n, k] / d z_n for every layer output z, all K columns in one batched
        # backward pass; sum_k (delta_k^2)^T a^2 = (sum_k delta_k^2)^T a^2: one product per layer.
        num_columns = rows.shape[1]
        basis = torch.eye(num_columns, dtype=rows.dtype, device=rows.device)
        cotangents = basis.unsqueeze(1).expand(num_columns, *rows.shape)
        try:
            if num_columns == 1:  # one column (regression, the empirical Fisher): a plain backward pass
                deltas = torch.autograd.grad(rows.sum(), outputs, allow_unused=True)
                squares = [None if delta is None else delta.detach() ** 2 for delta in deltas]
            else:
                deltas = torch.autograd.grad(rows, outputs, grad_outputs=cotangents, is_grads_batched=True,
                                             allow_unused=True)  # fmt: skip
                squares = [None if delta is None else (delta.detach() ** 2).sum(0) for delta in deltas]
        except RuntimeError:  # no batching rule somewhere in the network: one pass per column
            squares = [None] * len(outputs)
            for k in range(num_columns):
                deltas = torch.autograd.grad(rows[:, k].sum(), outputs, retain_graph=True, allow_unused=True)
                for i, delta in enumerate(deltas):
                    if delta is not None:
                        squared = delta.detach() ** 2
                        squares[i] = squared if squares[i] is None else squares[i] + squared
        for (weight_name, bias_name, inputs, _), squared in zip(recorder.calls, squares):
            if squared is None:
                continue
            if weight_name is not None:
                diag[weight_name] += squared.T @ inputs.detach() ** 2
            if bias_name is not None:
                diag[bias_name] += squared.sum(0)
    return torch.cat([diag[name].reshape(-1) for name in potential.site_names]), loglik.detach()


def full_data_plate(potential, position) -> Optional[SubsamplePlate]:
    """The one plate (not subsampled) that holds every observed site, as a plate walked in one chunk."""
    with torch.no_grad():
        trace = trace_at(potential, position, {})
    names = set()
    for site in observed_sites(trace, set(potential.site_names)):
        frames = [f for f in site["cond_indep_stack"] if f.vectorized]
        if len(frames) != 1:
            return None
        names.add((frames[0].name, frames[0].size))
    if len(names) != 1:
        return None
    ((name, size),) = names
    return SubsamplePlate(name, size, size)


def linear_sweep(potential, position, kind, num_mc_samples, monte_carlo_fisher, disable_progbar, check: bool = True,
                 plate=None):  # fmt: skip
    """Diagonal curvature (or K-FAC factors) of a network of ``F.linear`` layers; ``None`` if it does not apply.

    The plate is walked in chunks of its ``subsample_size`` (the last one overlapping). With
    ``check``, the empirical Fisher of the first four examples is also computed by the per-example
    route and the two must agree to rounding: this catches sites used outside the layers and
    examples that interact (batch norm), and the sweep then falls back to the per-example route.
    """
    if plate is None:
        (plate,) = potential.subsample_plates
    first_indices = {plate.name: torch.arange(plate.subsample_size, device=position.device)}
    keep_scale = keep_scales(potential, position, first_indices) if kind is not Curvature.DIAG_EF else {}
    if kind is not Curvature.DIAG_EF:
        check_ggn_sites(potential, position, first_indices, monte_carlo_fisher)
    if any(
        not any(f.name == plate.name for f in site["cond_indep_stack"])
        for site in observed_sites(trace_at(potential, position, first_indices), set(potential.site_names))
    ):
        return None  # an observation outside the data plate
    args = (plate.name, kind, num_mc_samples, keep_scale, monte_carlo_fisher)
    size = plate.size
    curvature, loglik = position.new_zeros(position.shape[0]), position.new_zeros(())
    pieces = chunks(size, plate.subsample_size, position.device)
    with pyro.validation_enabled(False):
        if check:
            index = pieces[0][0]
            probe = torch.arange(index.shape[0], device=position.device) < 4
            # the check is about the network's structure, so it uses the deterministic EF rows
            check_args = (plate.name, Curvature.DIAG_EF, num_mc_samples, keep_scale, monte_carlo_fisher)
            result = _linear_chunk(potential, position, index, probe, *check_args)
            if result is None:
                return None
            reference, _ = chunk_curvature(potential, position, plate.name, index, probe, True, Curvature.DIAG_EF,
                                           num_mc_samples, keep_scale, monte_carlo_fisher)  # fmt: skip
            tolerance = 1e-4 if position.dtype == torch.float32 else 1e-9
            scale = reference.abs().max().clamp(min=torch.finfo(position.dtype).tiny)
            if ((result[0] - reference).abs().max() / scale) > tolerance:
                return None
        sums: Dict[str, List[torch.Tensor]] = {}
        for index, new in progress(pieces, len(pieces), disable_progbar, "Laplace curvature"):
            result = _linear_chunk(potential, position, index, new, *args)
            if result is None:
                return None
            if kind is Curvature.KRON:
                for name, parts in result[0].items():
                    sums[name] = list(parts) if name not in sums else [t + p for t, p in zip(sums[name], parts)]
            else:
                curvature += result[0]
            loglik += result[1]
    if kind is not Curvature.KRON:
        return LikelihoodCurvature(curvature, loglik, size, "linear-layers")
    factors = kron_factors(potential, sums, size, curvature)
    return LikelihoodCurvature(curvature, loglik, size, "linear-layers", kron_factors=factors)
