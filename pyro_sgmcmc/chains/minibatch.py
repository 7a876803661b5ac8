"""Minibatch indices for subsampled plates, drawn per chain from keyed permutations.

Each chain walks through its own pseudo-random permutation of every subsampled plate, ``B``
indices per step, and reshuffles when fewer than ``B`` remain (an epoch; a remainder of ``N mod B``
indices is skipped). Each step's minibatch is therefore a ``B``-subset of the ``N`` data that is
uniform over the permutation's randomness, so the ``N / B``-scaled log-likelihood stays an unbiased
estimate; within an epoch minibatches do not overlap, which lowers the gradient-noise variance over
an epoch (sampling without replacement, as in SGD practice).

**One method, one stream.** Epoch :math:`e` of chain :math:`c` on plate :math:`p` is the keyed
bijection :math:`\\pi_{k}` of :class:`~pyro_sgmcmc.chains.permutation.KeyedPermutation` read in
order with the values :math:`\\ge N` skipped, with round keys
:math:`k = \\mathrm{epoch\\_keys}(b_{c,p}, e)` and :math:`b_{c,p}` from
:meth:`~pyro_sgmcmc.chains.streams.ChainGenerators.plate_words` of ``(seed, c, p)``. The stream of
chain ``c`` therefore depends on ``(seed, c, p)`` and the plate's ``N`` and ``B`` only: not on how
many chains share the process, on the other plates, on the number of processes, or on the noise
drawn (the chain's generator is not used). Memory and set-up are ``O(num_chains)``: no table of
``num_chains x N`` indices (at ``N = 10^7`` and 32 chains, 2.6 GB).

**Drawing ahead.** Evaluating the bijection costs about 90 elementwise integer operations per
position and at most 2 positions per index (``span / N``, between 1 and 2); per call, the fixed
cost of those operations dominates at small batches. The sampler therefore evaluates a block of up
to about :data:`DRAW_AHEAD` positions (all chains together) at once, whole epochs when
``num_chains x span`` fits (a table for small ``N``, the materialisation of the same permutations),
else the next steps of the current epoch; each step slices the block. The indices are the same
whatever the block: the stream does not depend on it either (tested). :func:`epoch_orders`
materialises whole epochs, for hand-written loops that must reproduce a run's minibatches.
"""

from __future__ import annotations

import math
import warnings
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import torch

from ..model.potential import SubsamplePlate
from .permutation import NUM_ROUNDS, KeyedPermutation, epoch_keys
from .streams import ChainGenerators

__all__ = ["DRAW_AHEAD", "DRAW_AHEAD_ON_DEVICE", "Block", "MinibatchSampler", "draw", "epoch_orders"]

#: About how many positions of the keyed permutations (all chains together) one evaluation covers.
DRAW_AHEAD = 2**14
#: The same for chains on a GPU (or any device but the CPU): each evaluation ends in one host read (a device
#: synchronisation, ``draw``'s check that every row got its values), and large blocks cost little there.
DRAW_AHEAD_ON_DEVICE = 2**20


class Block(NamedTuple):
    """Indices drawn ahead for one plate: ``values`` and their domain ``positions``, both
    ``(epochs, num_chains, length)``, from index ``cursor`` of epoch ``epoch`` on."""

    values: torch.Tensor
    positions: torch.Tensor
    epoch: int
    cursor: int


def _key_bases(generators: ChainGenerators, plate: str) -> torch.Tensor:
    """``(num_chains, 2, NUM_ROUNDS)``: the root of each chain's keys of ``plate``, see :func:`epoch_keys`."""
    return generators.plate_words(plate, 2 * NUM_ROUNDS).view(len(generators), 2, NUM_ROUNDS)


def draw(permutation: KeyedPermutation, start: torch.Tensor, count: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The next ``count`` values below ``n`` of each row's bijection from position ``start[row]`` on, and
    their positions, both ``(rows, count)``; each row must have ``count`` values left.

    About ``count / ratio`` positions give ``count`` values (``ratio = n / span > 1/2``); the margin
    (6 sd of the binomial count) makes a second evaluation rare, and the loop exact.
    """
    ratio = permutation.n / permutation.span
    width = math.ceil(count / ratio + 6 * math.sqrt(count * (1 - ratio)) / ratio) + 8
    while True:
        candidate = start.unsqueeze(-1) + torch.arange(width, device=start.device)
        values = permutation(candidate)
        valid = (values < permutation.n) & (candidate < permutation.span)
        rank = valid.cumsum(-1)
        if bool((rank[:, -1] >= count).all()):
            break
        width *= 2  # rare: near the end of the domain
    # the j-th value taken goes to column j - 1, the others to a spare last column (a scatter: no boolean
    # indexing, whose size is known only after a host round trip)
    column = torch.where(valid & (rank <= count), rank - 1, count)
    out = torch.empty((2, start.shape[0], count + 1), dtype=torch.long, device=start.device)
    out[0].scatter_(1, column, values)
    out[1].scatter_(1, column, candidate)
    return out[0, :, :count], out[1, :, :count]


def epoch_orders(generators: ChainGenerators, plate: str, size: int, epoch: int) -> torch.Tensor:
    """Epoch ``epoch`` (from 1) of each chain's stream of the plate ``plate`` of ``size`` data, whole.

    Returns ``(num_chains, size)``: row ``c`` is the permutation of ``range(size)`` whose consecutive
    slices of ``B`` a :class:`MinibatchSampler` on the same seed and chain ids returns as that epoch's
    minibatches. For a hand-written loop that must reproduce a run's minibatches:
    ``epoch_orders(ChainGenerators(seed, range(C)), "data", N, e)[:, i * B : (i + 1) * B]`` is step ``i``
    of epoch ``e``.
    """
    return KeyedPermutation(size, epoch_keys(_key_bases(generators, plate), int(epoch))).order()


class MinibatchSampler:
    """Per-chain epochs of keyed permutations of each subsampled plate.

    Parameters
    ----------
    plates : sequence of SubsamplePlate
        The model's subsampled plates (from :class:`~pyro_sgmcmc.ModelPotential`).
    generators : ChainGenerators
        The chains' seed and ids, which fix their keys per plate (the generators are not drawn from).
    draw_ahead : int, optional
        About how many positions (all chains together) one evaluation covers, default
        :data:`DRAW_AHEAD` (:data:`DRAW_AHEAD_ON_DEVICE` off the CPU; read when the sampler is made): whole
        epochs while ``num_chains * span``
        fits, else part of one. Any value gives the same indices.
    table_limit : None
        Deprecated, no effect: there are no permutation tables any more.

    Attributes
    ----------
    bases : dict
        Per plate, the roots ``(num_chains, 2, NUM_ROUNDS)`` of the chains' keys.
    positions : dict
        Per plate, each chain's position in the domain of its next index not drawn ahead.
    cursors, epochs : dict
        Per plate, the indices returned in the current epoch and the epochs begun.
    """

    def __init__(
        self,
        plates: Sequence[SubsamplePlate],
        generators: ChainGenerators,
        table_limit: Optional[int] = None,
        *,
        draw_ahead: Optional[int] = None,
    ) -> None:
        if table_limit is not None:
            warnings.warn(
                "MinibatchSampler(table_limit=) has no effect and will be removed: minibatches always come from "
                "keyed permutations, whose streams do not depend on a table limit",
                FutureWarning,
                stacklevel=2,
            )
        self.plates = [p for p in plates if not p.user_indices]  # the model draws the others itself
        self.generators = generators
        bad = isinstance(draw_ahead, bool) or not isinstance(draw_ahead, int) or draw_ahead < 1
        if draw_ahead is not None and bad:
            raise ValueError(
                f"draw_ahead must be None or a positive integer (positions per evaluation); got {draw_ahead!r}"
            )
        num_chains, device = len(generators), generators.device
        default = DRAW_AHEAD if torch.device(device).type == "cpu" else DRAW_AHEAD_ON_DEVICE
        self.draw_ahead = default if draw_ahead is None else draw_ahead
        self.bases = {p.name: _key_bases(generators, p.name) for p in self.plates}
        self.positions: Dict[str, torch.Tensor] = {
            p.name: torch.zeros(num_chains, dtype=torch.long, device=device) for p in self.plates
        }
        # Cursor at the end: the first call begins epoch 1.
        self.cursors: Dict[str, int] = {p.name: p.size for p in self.plates}
        self.epochs: Dict[str, int] = {p.name: 0 for p in self.plates}
        self.ahead: Dict[str, Optional[Block]] = {p.name: None for p in self.plates}

    @property
    def keys(self) -> Dict[str, torch.Tensor]:
        """Per plate, the round keys ``(num_chains, NUM_ROUNDS)`` of the current epoch."""
        return {name: epoch_keys(bases, self.epochs[name]) for name, bases in self.bases.items()}

    @property
    def permutations(self) -> Dict[str, torch.Tensor]:
        """Deprecated: always empty (there are no permutation tables any more)."""
        warnings.warn(
            "MinibatchSampler.permutations is deprecated and always empty: minibatches come from keyed "
            "permutations (see MinibatchSampler.keys and epoch_orders)",
            FutureWarning,
            stacklevel=2,
        )
        return {}

    def next(self) -> Dict[str, torch.Tensor]:
        """Indices for the next step: ``{plate name: LongTensor (num_chains, subsample_size)}``."""
        indices = {}
        for plate in self.plates:
            name, batch = plate.name, plate.subsample_size
            if self.cursors[name] + batch > plate.size:  # a new epoch, from the start of the domain
                self.epochs[name] += 1
                self.cursors[name] = 0
                self.positions[name].zero_()
            epoch, cursor, block = self.epochs[name], self.cursors[name], self.ahead[name]
            k = -1 if block is None else epoch - block.epoch
            j = cursor - (block.cursor if k == 0 else 0)
            if block is None or not (0 <= k < block.values.shape[0] and j + batch <= block.values.shape[-1]):
                block = self.ahead[name] = self._draw_ahead(plate)
                k, j = 0, 0
            indices[name] = block.values[k, :, j : j + batch]
            self.cursors[name] = cursor + batch
        return indices

    def _draw_ahead(self, plate: SubsamplePlate) -> Block:
        """Evaluate the next block: whole epochs from this one on at an epoch's start when ``num_chains x
        span`` fits :attr:`draw_ahead`, else the next steps of this epoch."""
        name, batch = plate.name, plate.subsample_size
        epoch, cursor, bases = self.epochs[name], self.cursors[name], self.bases[name]
        chains, span = bases.shape[0], KeyedPermutation.span_of(plate.size)
        per_epoch = (plate.size // batch) * batch  # the indices an epoch uses
        epochs = self.draw_ahead // (chains * span) if cursor == 0 else 0
        if epochs >= 1:
            numbers = torch.arange(epoch, epoch + epochs, device=bases.device).repeat_interleave(chains)
            keys = epoch_keys(bases.repeat(epochs, 1, 1), numbers.unsqueeze(-1))
            start, count = torch.zeros(epochs * chains, dtype=torch.long, device=bases.device), per_epoch
        else:
            epochs, keys, start = 1, epoch_keys(bases, epoch), self.positions[name]
            count = min(per_epoch - cursor, max(1, self.draw_ahead // (2 * chains * batch)) * batch)
        values, positions = draw(KeyedPermutation(plate.size, keys), start, count)
        self.positions[name] = positions[-chains:, -1] + 1
        return Block(values.view(epochs, chains, count), positions.view(epochs, chains, count), epoch, cursor)

    def _next_positions(self, name: str) -> torch.Tensor:
        """Each chain's position of its next index not yet returned (drawn ahead or not)."""
        block, cursor = self.ahead[name], self.cursors[name]
        if block is None or cursor == 0:
            return self.positions[name].clone()
        k = self.epochs[name] - block.epoch
        return block.positions[k, :, cursor - (block.cursor if k == 0 else 0) - 1] + 1

    def state_dict(self) -> dict:
        return {
            "permutations": {},  # no tables (the checkpoint format keeps the record)
            "keys": self.keys,
            "positions": {name: self._next_positions(name) for name in self.bases},
            "cursors": dict(self.cursors),
            "epochs": dict(self.epochs),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (of :meth:`state_dict`); a state written before the keys were derived
        from ``(seed, chain, plate, epoch)`` (tables, or keys drawn from the chains' generators) is refused."""
        for name, bases in self.bases.items():
            self.epochs[name] = int(state.get("epochs", {}).get(name, 0))
            keys = epoch_keys(bases, self.epochs[name])
            if state.get("permutations") or (
                self.epochs[name] > 0 and not torch.equal(state["keys"][name].to(keys.device), keys)
            ):
                raise ValueError(
                    "this minibatch state was written by an earlier pyro_sgmcmc (permutation tables, or keys not "
                    "derived from (seed, chain, plate, epoch)): its minibatch streams cannot be continued; start "
                    "the run afresh"
                )
            self.positions[name] = state["positions"][name].to(keys.device).clone()
            self.cursors[name] = int(state["cursors"][name])
            self.ahead[name] = None


def __getattr__(name: str):
    if name == "TABLE_LIMIT":  # deprecated: read by code written for the tables
        warnings.warn(
            "pyro_sgmcmc.chains.minibatch.TABLE_LIMIT is deprecated and has no effect: minibatches always come "
            "from keyed permutations (how many indices are drawn ahead: DRAW_AHEAD)",
            FutureWarning,
            stacklevel=2,
        )
        return 2**25
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
