"""Observed sites evaluated datum by datum on the full data, for every posterior draw, in bounded blocks.

The minibatches seen while sampling are random subsets, so what depends on the data (the pointwise
log-likelihood :math:`\\log p(y_n \\mid \\theta_s)`, one posterior-predictive draw per :math:`\\theta_s`, the
observed values) is recomputed here on the *full* data. A model with ``pyro.plate(name, N,
subsample_size=B)`` only runs on index sets of its own size ``B``, so each subsampled plate is walked in
its covering chunks (:class:`~pyro_sgmcmc.model.PlateChunks`: ``ceil(N / B)`` chunks, the last one
overlapping the one before; a datum seen twice is written twice, alike), and several plates through every
combination of their chunks.

One model call evaluates a block of ``D`` draws times ``K`` chunk combinations: the model runs under two
nested :func:`torch.func.vmap`, the inner one over the combinations with the latent values shared, the
outer one over the draws with the indices shared, so that, for a regression, the ``K B`` rows of data meet
the ``D`` parameter vectors in one matrix product. ``K`` is chosen so that one site's block holds at most
:func:`elements_per_call` values (:data:`ELEMENTS_PER_THREAD` per torch thread): the memory a call needs is
bounded whatever ``N`` and the number of draws. The log-likelihood's calls are recorded once per shape of
block as the list of operators they ran, checked bit for bit against a second call of the model, and replayed
(:mod:`~pyro_sgmcmc.export.replay`): Pyro, the model's Python and vmap's batching rules then run twice per
shape, not at every block. A model whose recording is refused (random numbers, a value read to Python) is
called at every block, as before. A model that cannot run under vmap is evaluated combination by combination,
then draw by draw (slower, same values). Everything is computed in the model's own dtype (float32 data give a
float32 log-likelihood).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import pyro
import pyro.poutine as poutine
import torch

from ..model import PlateChunks, trace_at
from ..model.compiled import out_of_memory
from .log_prob import pointwise_log_prob
from .placement import Placement, target_like
from .replay import ReplayedCalls

__all__ = ["ELEMENTS_PER_CALL", "ELEMENTS_PER_THREAD", "FullData", "SiteLayout", "elements_per_call"]

#: values of one site per vectorised model call and torch thread: small enough that a thread's share of a block's
#: intermediates (2^17 float32 values: 0.5 MB) stays in its core's cache, large enough that the per-call work
#: outside the operators (a replay's dispatch, the placement of the block, the threads' start and join on each
#: operator) stays small. Measured with the replay on the benchmark's logistic regression
#: (benchmarks/loglik_export.py's model, float32): one thread, 2,048 draws x 20,000 data, output pages already
#: touched (2026-11-27, load 2.3; CPU ns a value, best of 3): 2^15 9.6, 2^16 8.0, 2^17 6.9 (7.3 with 256 draws a
#: call), 2^18 8.2, 2^19 11.3; two threads, issue 26's case end to end (2026-11-27, wall s): 2^17 a call 1.22,
#: 2^18 0.96, 2^19 0.97 (one run each, load 0.7-0.8); 2^17 1.18-1.44, 2^18 0.94-1.19 (three alternating runs each,
#: load 1.1-1.5). The peak memory over a 128 MB output stays below 1.3x
ELEMENTS_PER_THREAD = 2**17
#: values of one site per vectorised model call; ``None``: :data:`ELEMENTS_PER_THREAD` times torch's threads
ELEMENTS_PER_CALL: Optional[int] = None


def elements_per_call() -> int:
    """Values of one site per vectorised model call: :data:`ELEMENTS_PER_CALL` if set, else
    :data:`ELEMENTS_PER_THREAD` per torch thread (``torch.get_num_threads()``)."""
    if ELEMENTS_PER_CALL is not None:
        return ELEMENTS_PER_CALL
    return ELEMENTS_PER_THREAD * max(1, torch.get_num_threads())

#: ``"log_likelihood"``: ``fn.log_prob(value)`` of each observed site (unscaled, unmasked, as Pyro's trace's
#: ``unscaled_log_prob``; by :func:`~pyro_sgmcmc.export.log_prob.pointwise_log_prob`); ``"posterior_predictive"``:
#: a fresh draw of each observed site (model unconditioned); ``"observed_data"``: the observed values
QUANTITIES = ("log_likelihood", "posterior_predictive", "observed_data")


@dataclass(frozen=True)
class SiteLayout:
    """Where one observed site's quantity lives: its full-data ``shape``, its ``dims`` (a plate's axis named
    after the plate, the others ``<site>_dim_<i>``), its ``dtype``, and which axes are subsampled plates."""

    name: str
    shape: Tuple[int, ...]
    dims: Tuple[str, ...]
    dtype: torch.dtype
    plate_axes: Tuple[Optional[str], ...]  # per axis: the subsampled plate indexing it, or None
    minibatch_numel: int  # values per chunk combination

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()


class FullData:
    """The observed sites of a model on its full data (module docstring).

    Parameters
    ----------
    potential : ModelPotential
        The run's potential: its model, arguments, latent sites and subsampled plates.
    position : Tensor ``(dim,)``
        Any unconstrained position: the model is traced there once, to find the observed sites.
    """

    def __init__(self, potential, position: torch.Tensor) -> None:
        self.potential = potential
        self.plates = list(potential.subsample_plates)
        self._tables = [PlateChunks(plate, potential.device).rows() for plate in self.plates]
        self.num_combinations = math.prod(len(table) for table in self._tables)
        self._evaluators: Dict[str, _Evaluator] = {}  # per quantity, kept: its replays and its fallbacks
        trace = self.trace(position, self._rows(0, 1, squeeze=True))
        plate_names = {plate.name for plate in self.plates}
        self.observed: List[str] = [
            name for name, site in trace.nodes.items() if site["type"] == "sample" and site["is_observed"]
            and name not in potential.site_names and name not in plate_names
        ]  # fmt: skip
        sizes = {plate.name: plate.size for plate in self.plates}
        self.layouts: Dict[str, Dict[str, SiteLayout]] = {quantity: {} for quantity in QUANTITIES}
        for name in self.observed:
            site = trace.nodes[name]
            value = site["value"]
            with pyro.validation_enabled(False), torch.no_grad():
                log_prob = pointwise_log_prob(site["fn"], value)
            for quantity, tensor in (("observed_data", value), ("posterior_predictive", value),
                                     ("log_likelihood", log_prob)):  # fmt: skip
                self.layouts[quantity][name] = _layout(name, site, tensor, sizes)

    # ------------------------------------------------------------------ what a quantity takes
    def nbytes(self, quantity: str, num_draws: int, dtype: Optional[torch.dtype] = None) -> int:
        """Bytes of ``quantity`` for ``num_draws`` draws, all observed sites together, in the model's dtype
        or ``dtype``."""
        size = torch.empty((), dtype=dtype).element_size() if dtype is not None else None
        return num_draws * sum(layout.numel * (size or layout.itemsize) for layout in self.layouts[quantity].values())

    def draws_per_call(self, quantity: str, chunk_size: int) -> int:
        """Draws evaluated together: ``chunk_size``, fewer if one chunk combination of that many would
        exceed :func:`elements_per_call` for a site."""
        return max(1, min(chunk_size, elements_per_call() // self._per_combination(quantity)))

    def _per_combination(self, quantity: str) -> int:
        return max((layout.minibatch_numel for layout in self.layouts[quantity].values()), default=1) or 1

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self,
        quantity: str,
        positions: torch.Tensor,
        targets: Mapping[str, torch.Tensor],
        chunk_size: int,
    ) -> None:
        """Write ``quantity`` at the unconstrained ``positions`` ``(S, dim)`` into ``targets`` (one tensor
        ``(S, *layout.shape)`` per observed site, any dtype: values are cast on the way in).

        The draws go ``chunk_size`` at a time (:meth:`draws_per_call`), the chunk combinations as many at a
        time as :func:`elements_per_call` allows; nothing larger than one call's block is allocated besides
        ``targets``."""
        self._write(quantity, positions, chunk_size, lambda places, values: targets)

    def evaluated(
        self, quantity: str, positions: torch.Tensor, chunk_size: int, dtype: Optional[torch.dtype] = None
    ) -> Dict[str, torch.Tensor]:
        """``quantity`` at ``positions`` ``(S, dim)`` in new tensors ``{site: (S, *layout.shape)}``, in the
        model's dtype or ``dtype``, each laid out in memory as the vectorised blocks come out of the model.

        A regression's block comes out of vmap's matrix product with the draw axis fastest in memory; a target
        in the usual row-major order would take every block through a transposing copy (1.2 ns a value on the
        machine of ``benchmarks/loglik_export.py``, a third of the whole evaluation). A target in the block's
        order (:func:`~pyro_sgmcmc.export.placement.target_like`) takes each block as a streaming copy. The
        tensors are views with the shape asked for; only their strides follow the blocks."""
        targets: Dict[str, torch.Tensor] = {}

        def allocated(places: Mapping[str, Placement], values: Mapping[str, torch.Tensor]):
            if not targets:  # at the first block (or with no draws), in that block's order
                for name, layout in self.layouts[quantity].items():
                    shape = (positions.shape[0], *layout.shape)
                    targets[name] = target_like(
                        places.get(name), values.get(name), shape, dtype or layout.dtype, positions.device
                    )
            return targets

        self._write(quantity, positions, chunk_size, allocated)
        return allocated({}, {})

    def _write(self, quantity: str, positions: torch.Tensor, chunk_size: int, targets_for: Callable) -> None:
        """Evaluate every vectorised call and write its block into ``targets_for(places, values)[site]``."""
        if quantity not in QUANTITIES:
            raise ValueError(f"quantity must be one of {QUANTITIES}; got {quantity!r}")
        layouts = self.layouts[quantity]
        draws = self.draws_per_call(quantity, chunk_size)
        per_call = elements_per_call() // (self._per_combination(quantity) * draws)
        combinations = max(1, min(self.num_combinations, per_call))
        if quantity not in self._evaluators:
            self._evaluators[quantity] = _Evaluator(self, quantity)
        evaluator = self._evaluators[quantity]
        blocks = []  # the same chunk combinations for every block of draws: their rows and places, found once
        for first in range(0, self.num_combinations, combinations):
            rows = self._rows(first, min(first + combinations, self.num_combinations))
            blocks.append((rows, {name: Placement.of(layout, rows) for name, layout in layouts.items()}))
        with pyro.validation_enabled(False), torch.no_grad():
            for start in range(0, positions.shape[0], draws):
                block = positions[start : start + draws]
                for rows, places in blocks:
                    values = evaluator(block, rows)
                    targets = targets_for(places, values)
                    for name, place in places.items():
                        place.write(targets[name][start : start + block.shape[0]], values[name])

    # ------------------------------------------------------------------ pieces
    def _rows(self, first: int, stop: int, squeeze: bool = False) -> Dict[str, torch.Tensor]:
        """``{plate: (K, B_p)}`` for chunk combinations ``first`` to ``stop`` (row-major over the plates'
        chunks); with ``squeeze``, one combination's ``{plate: (B_p,)}``."""
        combos = torch.arange(first, stop, device=self.potential.device)
        rows, stride = {}, 1
        for plate, table in reversed(list(zip(self.plates, self._tables))):
            rows[plate.name] = table[(combos // stride) % len(table)]
            stride *= len(table)
        return {name: r[0] for name, r in rows.items()} if squeeze else rows

    def trace(self, position: torch.Tensor, indices: Mapping[str, torch.Tensor], model: Optional[Callable] = None):
        """The model traced at the unconstrained ``position`` with the plates' ``indices``."""
        potential = self.potential
        unpacked = potential.unpack(position)
        values = {site.name: site.transform(unpacked[site.name]) for site in potential.sites}
        return trace_at(model or potential.model, potential.model_args, potential.model_kwargs, values, indices)


class _Evaluator:
    """``(positions (D, dim), rows {plate: (K, B_p)}) -> {site: (D, K, *minibatch shape)}``, vectorised over
    draws and combinations when the model allows, with fallbacks that give the same values."""

    def __init__(self, full: FullData, quantity: str) -> None:
        self.full = full
        self.quantity = quantity
        self.model = poutine.uncondition(full.potential.model) if quantity == "posterior_predictive" else None
        one = self.one
        over_draws = torch.func.vmap(one, in_dims=(0, None), randomness="different")
        if full.plates:
            both = torch.func.vmap(torch.func.vmap(one, in_dims=(None, 0), randomness="different"),
                                   in_dims=(0, None), randomness="different")  # fmt: skip
        else:  # nothing to batch over inside: one "combination"

            def both(positions, rows):
                return {k: v.unsqueeze(1) for k, v in over_draws(positions, rows).items()}

        # the log-likelihood is a function of the draw and the data alone: its vectorised calls are recorded and
        # replayed (module docstring); the posterior predictive draws random numbers, which a replay must not fix
        first = ReplayedCalls(both) if quantity == "log_likelihood" else both
        self.strategies: List[Callable] = [first, self._over_draws(over_draws), self._one_by_one]

    def one(self, position: torch.Tensor, indices: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        trace = self.full.trace(position, indices, self.model)
        nodes = trace.nodes
        if self.quantity == "log_likelihood":
            return {name: pointwise_log_prob(nodes[name]["fn"], nodes[name]["value"]) for name in self.full.observed}
        return {name: nodes[name]["value"] for name in self.full.observed}

    def __call__(self, positions: torch.Tensor, rows: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        while True:
            strategy = self.strategies[0]
            try:
                return strategy(positions, rows)
            except RuntimeError as error:  # an op without a batching rule, data-dependent control flow, .item()
                if out_of_memory(error) or len(self.strategies) == 1:
                    raise
                self.strategies.pop(0)
                # warned for the log-likelihood only: posterior_predictive lands here for most models (Pyro's
                # samplers fill tensors in place, ``normal_``, which vmap cannot make differ per draw), as it
                # did before, and observed_data is one draw
                if len(self.strategies) == 1 and self.quantity == "log_likelihood":
                    warnings.warn(
                        f"the model cannot run under torch.func.vmap ({str(error).splitlines()[0]}); the "
                        f"{self.quantity} is evaluated draw by draw, which is slower",
                        RuntimeWarning,
                    )

    @staticmethod
    def _over_draws(over_draws: Callable) -> Callable:
        def per_combination(positions, rows):
            parts = [over_draws(positions, {k: v[i] for k, v in rows.items()}) for i in range(_count(rows))]
            return {name: torch.stack([p[name] for p in parts], dim=1) for name in parts[0]}

        return per_combination

    def _one_by_one(self, positions: torch.Tensor, rows: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        draws = []
        for position in positions:
            parts = [self.one(position, {k: v[i] for k, v in rows.items()}) for i in range(_count(rows))]
            draws.append({name: torch.stack([p[name] for p in parts]) for name in parts[0]})
        return {name: torch.stack([d[name] for d in draws]) for name in draws[0]}


def _count(rows: Mapping[str, torch.Tensor]) -> int:
    return next(iter(rows.values())).shape[0] if rows else 1


def _layout(name: str, site, tensor: torch.Tensor, sizes: Mapping[str, int]) -> SiteLayout:
    """The layout of ``tensor`` (the site's value or its log-probability, at one chunk combination): a
    plate's axis sits at ``frame.dim`` counted from the end of the batch dims (Pyro's convention)."""
    event_ndim = site["fn"].event_dim if tensor is site["value"] else 0
    batch_ndim = tensor.dim() - event_ndim
    dims = [f"{name}_dim_{i}" for i in range(tensor.dim())]
    plate_axes: List[Optional[str]] = [None] * tensor.dim()
    for frame in site["cond_indep_stack"]:
        if frame.vectorized and frame.dim is not None and -frame.dim <= batch_ndim:
            axis = batch_ndim + frame.dim
            dims[axis] = frame.name
            if frame.name in sizes:
                plate_axes[axis] = frame.name
    shape = tuple(sizes[p] if p is not None else n for p, n in zip(plate_axes, tensor.shape))
    return SiteLayout(name, shape, tuple(dims), tensor.dtype, tuple(plate_axes), tensor.numel())
