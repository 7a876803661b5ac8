"""Where the full-data groups go: arrays in memory, checked against a memory cap, or a netCDF file written
block by block.

:func:`in_memory` allocates each observed site's array once, ``(chains * draws, *full shape)`` in the
requested dtype (:meth:`~pyro_sgmcmc.export.pointwise.FullData.evaluated`, laid out as the model's blocks
come): the peak is the arrays plus one vectorised call's block. The arrays come from torch's allocator and are
handed out as NumPy views: NumPy asks the kernel for transparent huge pages on a large array (``madvise``),
and where the kernel's THP ``defrag`` setting is ``madvise`` (as on the machine of
``benchmarks/loglik_export.py``) their first touch is slow: 1.7-2.2 s to fill a fresh GB there against
0.39-0.46 s for torch's ordinary pages on one thread (2026-11-27, fresh processes, load below 1.5). Before
anything is allocated, :func:`check_fits` compares the bytes the in-memory groups will take with a cap
(``max_memory``, by default the memory the operating system reports available) and refuses, naming the size,
what does not fit.

:func:`to_netcdf_file` writes the log-likelihood into a netCDF-4 file (HDF5, through ``h5netcdf``) as the
group ``log_likelihood`` of an ArviZ file, :data:`FILE_BUFFER_BYTES` of draws at a time, and returns the
group opened lazily from the file: the memory it needs is one buffer, whatever the number of draws.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

import numpy as np
import torch

from .pointwise import FullData, SiteLayout

__all__ = ["FILE_BUFFER_BYTES", "available_memory", "check_fits", "in_memory", "to_netcdf_file"]

#: bytes of draws evaluated before each write to a netCDF file (fewer draws than ``chunk_size`` if needed)
FILE_BUFFER_BYTES = 64 * 2**20


def available_memory() -> Optional[int]:
    """The memory the operating system reports available to a new allocation, in bytes (Linux:
    ``MemAvailable`` of ``/proc/meminfo``); ``None`` where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(sizes: Mapping[str, int], max_memory: Optional[int], path_argument: str) -> None:
    """Refuse, naming the sizes, groups whose total ``sizes`` (bytes, per group) exceed ``max_memory`` (or the
    memory available, when ``None`` and readable), before anything is allocated."""
    total = sum(sizes.values())
    cap = max_memory if max_memory is not None else available_memory()
    if cap is None or total <= cap:
        return
    what = ", ".join(f"{group} {_human(size)}" for group, size in sizes.items() if size)
    limit = f"max_memory={_human(cap)}" if max_memory is not None else f"the memory available ({_human(cap)})"
    raise MemoryError(
        f"to_inference_data: the requested groups would take {_human(total)} in memory ({what}), more than "
        f"{limit}. Pass {path_argument}='<file>.nc' to write the log-likelihood to a netCDF file in blocks of "
        f"{_human(FILE_BUFFER_BYTES)}, keep fewer draws (thinning) or fewer groups, or raise max_memory"
    )


def in_memory(
    full: FullData, quantity: str, positions: torch.Tensor, chunk_size: int, dtype: Optional[torch.dtype]
) -> Dict[str, np.ndarray]:
    """``quantity`` of every observed site at ``positions`` ``(S, dim)``: ``{site: (S, *full shape)}``, in the
    model's dtype or ``dtype``."""
    tensors = full.evaluated(quantity, positions, chunk_size, dtype)
    return {name: tensor.numpy() for name, tensor in tensors.items()}


def to_netcdf_file(
    path: "os.PathLike[str] | str",
    full: FullData,
    positions: torch.Tensor,
    num_chains: int,
    chunk_size: int,
    dtype: Optional[torch.dtype],
    dims: Mapping[str, Sequence[str]],
):
    """Write the log-likelihood at ``positions`` (``(chains * draws, dim)``, chain-major) to ``path`` as the
    ``log_likelihood`` group of a netCDF-4 file, one buffer of at most :data:`FILE_BUFFER_BYTES` of draws at
    a time (at least one draw), and return that group opened lazily (``xarray.open_dataset``).

    The file is written under a temporary name in the same directory and renamed over ``path`` once
    complete: an interrupted export leaves no partial file under the name."""
    try:
        import h5netcdf
        import xarray as xr
    except ImportError as error:
        raise ImportError(f"log_likelihood_path needs h5netcdf and xarray ({error}); pip install h5netcdf") from error
    from ..atomic_write import temporary_name

    path = Path(path)
    layouts = full.layouts["log_likelihood"]
    num_draws = positions.shape[0] // num_chains
    per_draw = max(1, full.nbytes("log_likelihood", 1, dtype))
    draws = max(1, min(chunk_size, num_draws, FILE_BUFFER_BYTES // per_draw))
    temporary = temporary_name(path)
    try:
        with h5netcdf.File(temporary, "w") as f:
            group = f.create_group("log_likelihood")
            variables = _create_variables(group, layouts, dims, num_chains, num_draws, dtype)
            buffers = {name: torch.empty((draws, *layout.shape), dtype=dtype or layout.dtype)
                       for name, layout in layouts.items()}  # fmt: skip
            for start in range(0, positions.shape[0], draws):
                stop = min(start + draws, positions.shape[0])
                block = {name: b[: stop - start] for name, b in buffers.items()}
                full.evaluate("log_likelihood", positions[start:stop], block, chunk_size)
                for name, values in block.items():
                    _write_draws(variables[name], values.numpy(), start, num_draws)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return xr.open_dataset(path, group="log_likelihood", engine="h5netcdf")


def _create_variables(group, layouts: Mapping[str, SiteLayout], dims, num_chains: int, num_draws: int, dtype):
    sizes = {"chain": num_chains, "draw": num_draws}
    for name, layout in layouts.items():
        sizes.update(zip(site_dims(name, layout, dims), layout.shape))
    group.dimensions = sizes
    for dim, size in sizes.items():  # coordinate variables, as ArviZ writes them
        group.create_variable(dim, (dim,), data=np.arange(size))
    variables = {}
    for name, layout in layouts.items():
        shape = (num_chains, num_draws, *layout.shape)
        chunks = (1, max(1, min(num_draws, 2**20 // max(layout.numel, 1))), *layout.shape)
        variables[name] = group.create_variable(
            name, ("chain", "draw", *site_dims(name, layout, dims)), dtype=_numpy_dtype(dtype or layout.dtype),
            chunks=tuple(min(c, s) for c, s in zip(chunks, shape)),
        )  # fmt: skip
    return variables


def _write_draws(variable, values: np.ndarray, start: int, num_draws: int) -> None:
    """Write the flat (chain-major) draws ``start, start + 1, ...`` into ``variable[chain, draw, ...]``."""
    offset = 0
    while offset < values.shape[0]:
        chain, draw = divmod(start + offset, num_draws)
        count = min(values.shape[0] - offset, num_draws - draw)
        variable[chain, draw : draw + count, ...] = values[offset : offset + count]
        offset += count


def site_dims(name: str, layout: SiteLayout, dims: Mapping[str, Sequence[str]]) -> list:
    """The dims of a site's quantity: the user's (``dims=``), cut to the quantity's rank, else the layout's."""
    given = list(dims.get(name, ()))[: len(layout.shape)]
    return given + list(layout.dims[len(given) :])


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


def _human(size: int) -> str:
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= factor:
            return f"{size / factor:.2f} {unit}"
    return f"{size} bytes"
