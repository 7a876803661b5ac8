"""Deprecated: :func:`retain_freed_cpu_memory` no longer changes the C library's allocator.

It used to call glibc's ``mallopt`` to raise the mmap and trim thresholds, so that large tensors freed
at one step were reused at the next instead of being mapped afresh and faulted in page by page. That
setting belongs to the whole process (every library in it allocates through the same ``malloc``) and
lasts until the process ends, and a library must not change process-wide state: issue #19. The
function is kept for one release; it warns and does nothing.

What is left to do: nothing to call. A user who wants the effect for a whole process sets glibc's
tunables in the environment before Python starts, for example
``MALLOC_MMAP_THRESHOLD_=2147483647 MALLOC_TRIM_THRESHOLD_=2147483647 python run.py``: freed blocks
of up to 2 GiB then stay in the heap and are reused (measured in ``tests/test_allocation.py``: two
64 MiB tensors made and freed per round fault in all 32,768 of their 4 KiB pages by default and none
with these variables), at the price of a resident memory that stays at its peak.
"""

from __future__ import annotations

import warnings

__all__ = ["retain_freed_cpu_memory"]


def retain_freed_cpu_memory(max_block_bytes: object = None) -> bool:
    """Deprecated no-op: emits a :class:`FutureWarning` and returns ``False``.

    The allocator's thresholds are process-wide state, which a library must not change; nothing in
    the process is changed any more. For the same effect, set ``MALLOC_MMAP_THRESHOLD_`` and
    ``MALLOC_TRIM_THRESHOLD_`` in the environment before Python starts (see the module's docstring).

    Parameters
    ----------
    max_block_bytes : object
        Accepted and ignored (it used to be the mmap threshold in bytes).

    Returns
    -------
    bool
        Always ``False``: no setting was applied.
    """
    warnings.warn(
        "pyro_sgmcmc.retain_freed_cpu_memory is deprecated and has no effect: it used to change the C "
        "library's allocator (mallopt), which is process-wide state that a library must not change. "
        "There is nothing to call instead; to keep freed memory in the process, set MALLOC_MMAP_THRESHOLD_ "
        "and MALLOC_TRIM_THRESHOLD_ in the environment before Python starts",
        FutureWarning,
        stacklevel=2,
    )
    return False
