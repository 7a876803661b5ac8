"""The chains' starting points: given, or drawn from the init strategy, reproducibly from the run's seed.

Superchains. ``num_chains`` chains in ``K = num_superchains`` superchains of ``num_chains / K`` consecutive
chains each; the chains of a superchain start from the same point (nested R-hat, Margossian et al. 2024).

Seeds. With ``seed=None`` a drawn start comes from Pyro's ``init_strategy`` through torch's global generator,
as in Pyro (``pyro.set_rng_seed`` makes it reproducible). With a ``seed``, the start of superchain ``s`` (its
*global* id: a process holding chains ``chain_ids`` of a larger run knows which superchains they belong to) is
drawn with the global generator seeded from :func:`~pyro_sgmcmc.chains.streams.chain_seed` ``(seed, s)`` inside
:func:`torch.random.fork_rng`: a function of ``(seed, s)`` only, and the global generator is left as it was.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping, Optional, Sequence

import torch

from ..chains.streams import chain_seed

__all__ = ["initial_positions", "global_superchain_ids", "seeded_global_rng", "preserved_global_rng"]


@contextlib.contextmanager
def preserved_global_rng(device: torch.device, seed: Optional[int] = None) -> Iterator[None]:
    """Run the block with torch's global generators (the CPU's and, for a CUDA ``device``, that device's)
    restored afterwards; seeded with ``seed`` inside the block if given."""
    device = torch.device(device)
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.random.default_generator.manual_seed(seed)
            if devices:
                with torch.cuda.device(devices[0]):
                    torch.cuda.manual_seed(seed)
        yield


def seeded_global_rng(seed: Optional[int], superchain: int, device: torch.device):
    """The block draws from the global generator seeded with ``chain_seed(seed, superchain)`` and leaves it as
    it was; with ``seed=None`` it draws from (and advances) the global generator, as Pyro does."""
    if seed is None:
        return contextlib.nullcontext()
    return preserved_global_rng(device, chain_seed(seed, superchain))


def global_superchain_ids(num_chains: int, num_superchains: int, chain_ids: Optional[Sequence[int]] = None) -> list:
    """The global id of each local superchain: its first chain's global id over the superchain size (chains of a
    superchain are consecutive, so a process holding a contiguous block of a run's chains gets the run's ids)."""
    size = num_chains // num_superchains
    first = range(0, num_chains, size)
    if chain_ids is None:
        return [c // size for c in first]
    return [int(chain_ids[c]) // size for c in first]


def initial_positions(
    potential, initial_params: Optional[Mapping[str, torch.Tensor]], num_chains: int, num_superchains: int,
    seed: Optional[int] = None, superchains: Optional[Sequence[int]] = None,
) -> torch.Tensor:  # fmt: skip
    """``(num_chains, dim)`` starting positions, each superchain's point repeated for its chains.

    Parameters
    ----------
    potential : ModelPotential
        Packs ``initial_params`` and draws from the init strategy (``initial_position``).
    initial_params : dict, optional
        Unconstrained values with a leading axis of ``num_chains`` or ``num_superchains``; checked to be
        finite. ``None``: drawn from the init strategy.
    num_chains, num_superchains : int
    seed : int, optional
        Draw superchain ``s``'s start from ``(seed, s)`` only (module docstring).
    superchains : sequence of int, optional
        The superchains' global ids (default ``range(num_superchains)``).
    """
    repeats = num_chains // num_superchains
    if initial_params is not None:
        positions = _pack(potential, initial_params, num_chains, num_superchains)
        with seeded_global_rng(seed, 0, potential.device):  # the finiteness check draws a minibatch
            starts = positions.unique(dim=0)
            vectorised = hasattr(potential, "draw_start")  # a potential without it checks one by one
            finite = _finite(potential, starts, [potential.check_indices() for _ in starts]) if vectorised else None
            if finite is None:  # one by one: names the problem
                for position in starts:
                    potential.initial_position(potential.unpack(position))
            elif not all(finite):
                raise ValueError(
                    f"initial_params give a non-finite potential energy or gradient at {finite.count(False)} of "
                    f"the {len(finite)} distinct starting points"
                )
        return positions
    superchains = list(range(num_superchains)) if superchains is None else list(superchains)
    if not hasattr(potential, "draw_start"):  # a potential that only draws one point at a time
        drawn = [_draw_checked(potential, seed, superchain) for superchain in superchains]
        return torch.stack(drawn).repeat_interleave(repeats, 0)
    draws = []
    for superchain in superchains:
        with seeded_global_rng(seed, superchain, potential.device):
            # seeded: not the build trace's values, which were drawn before the seed was set
            draws.append(potential.draw_start(fresh=seed is not None))
    starts = torch.stack([position for position, _ in draws])
    finite = _finite(potential, starts, [indices for _, indices in draws])
    for row, superchain in enumerate(superchains):
        if finite is None or not finite[row]:  # drawn again from the start of its stream, checked one by one
            starts[row] = _draw_checked(potential, seed, superchain)
    return starts.repeat_interleave(repeats, 0)


def _draw_checked(potential, seed: Optional[int], superchain: int) -> torch.Tensor:
    """Superchain ``superchain``'s start drawn and checked one draw at a time (up to ``max_tries``)."""
    with seeded_global_rng(seed, superchain, potential.device):
        return potential.initial_position(fresh=seed is not None)


def _finite(potential, starts: torch.Tensor, checks: Sequence[Mapping[str, torch.Tensor]]) -> Optional[list]:
    """Whether each start's potential and gradient are finite on its own check minibatch, in one vectorised
    evaluation (a loop of single-chain evaluations was most of the set-up at thousands of chains: about 2 ms a
    chain on the CPU, 3 ms on a GPU); ``None`` if the evaluation failed (the caller checks one by one, which names
    the problem)."""
    indices = {name: torch.stack([check[name] for check in checks]) for name in checks[0]}
    try:
        energy, grad = potential.batched_potential_and_grad(starts, indices)
    except Exception:  # noqa: BLE001 - any failure: the one-by-one path raises it with the site named
        return None
    return (torch.isfinite(energy) & torch.isfinite(grad).all(-1)).tolist()


def _pack(potential, initial_params, num_chains: int, num_superchains: int) -> torch.Tensor:
    if not isinstance(initial_params, Mapping):
        raise TypeError(
            f"initial_params must be a dict {{site name: unconstrained tensor}}; got {type(initial_params).__name__}"
        )
    leading = set()
    for name, value in initial_params.items():
        try:
            value = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"initial_params[{name!r}] must be a tensor or array of numbers; got {value!r}") from error
        leading.add(int(value.shape[0]) if value.dim() else 0)
    if leading == {num_chains}:
        return potential.pack(initial_params, (num_chains,))
    if leading == {num_superchains}:
        return potential.pack(initial_params, (num_superchains,)).repeat_interleave(num_chains // num_superchains, 0)
    raise ValueError(
        f"initial_params must have a leading axis of num_chains={num_chains} or "
        f"num_superchains={num_superchains} on every site; got leading sizes {sorted(leading)}"
    )
