"""Pinned host memory at its exact size: strata's pinned_host_pool as PyTorch's pinned-memory allocator.

    import strata_torch
    strata_torch.enable_pinned()              # or enable(..., pinned=True), or STRATA_TORCH_PINNED=1
    x = torch.empty(n, pin_memory=True)       # held at n rounded to 4 KiB pages, not to a power of two
    y = t.pin_memory()                        # likewise; DataLoader(pin_memory=True) pins the same way
    strata_torch.pinned_stats()               # pinned, in use, requested, pins made, time spent pinning

It is installed in PyTorch's host-allocator registry for CUDA (libstrata_torch_hooks.so, built against this
PyTorch), so whatever PyTorch routes through that registry reaches it: docs/pytorch.md, "Pinned host memory",
says which calls do and what the ones that do not need. Install it before the first pinned allocation.

Under enable(..., pinned=True) the pool also lends sleep/wake's backup: a pause (strata_torch.pause) copies
the tags' tensors into blocks of this pool and a resume gives them back at once, so pinned tensors and paused
tags share one set of pinned pages (docs/sleep_wake.md, "One pinned budget").
"""

import ctypes
import os
import threading

ENV_PINNED = "STRATA_TORCH_PINNED"
_FIGURES = ("pinned", "peak_pinned", "in_use", "requested", "waiting", "blocks", "pins", "unpins", "pin_ns",
            "unpin_ns", "host_waits", "events_recorded", "numa_node")

_lock = threading.Lock()
_functions = {}
_lending = [False]   # lend_pinned() made the device stacks borrow the backup from the pool


def _function(name, restype, argtypes):
    """`name` from libstrata_torch_hooks.so, loaded once; RuntimeError naming what is missing."""
    with _lock:
        if name not in _functions:
            from . import _hooks_function, _hooks_library
            lib, function, why = _hooks_function(name, "offers no pinned-memory allocator")
            if why is not None:
                raise RuntimeError(f"strata_torch pinned memory: {why}. Build it where PyTorch is installed "
                                   "(CMAKE_PREFIX_PATH=torch.utils.cmake_prefix_path, see docs/pytorch.md)")
            function.restype, function.argtypes = restype, argtypes
            _hooks_library.append(lib)   # kept loaded: PyTorch holds the allocator it points to
            _functions[name] = function
        return _functions[name]


def _last_error():
    return _function("strata_torch_pinned_last_error", ctypes.c_char_p, [])().decode(errors="replace")


def enable_pinned():
    """Make strata's pool PyTorch's pinned-memory allocator for CUDA. RuntimeError when PyTorch's own already
    holds pinned blocks (install before the first pinned allocation) or the hooks library is missing."""
    if _function("strata_torch_install_pinned", ctypes.c_int, [])() != 0:
        raise RuntimeError(f"strata_torch.enable_pinned: {_last_error()}")


def lend_pinned():
    """Every device's page-mapped stack borrows its sleep/wake backup from strata's pinned pool (installed
    first): True, or False where the stacks cannot sleep (stack=coalescing: nothing to lend). RuntimeError
    while a device holds backup memory of its own (a tag paused, or reserve_backup): resume or release_backup()
    first."""
    answer = _function("strata_torch_lend_pinned", ctypes.c_int, [ctypes.c_int])(1)
    if answer < 0:
        raise RuntimeError(f"strata_torch: lending the pinned pool to sleep/wake: {_last_error()}")
    with _lock:
        _lending[0] = answer == 1
    return answer == 1


def _stop_lending():
    """The stacks pin their own backup again. RuntimeError while a paused tag's backup is the pool's."""
    if _function("strata_torch_lend_pinned", ctypes.c_int, [ctypes.c_int])(0) < 0:
        raise RuntimeError(f"strata_torch.disable_pinned: {_last_error()}; resume the paused tags first")
    with _lock:
        _lending[0] = False


def disable_pinned():
    """Give PyTorch its own pinned-memory allocator back (after unpinning strata's idle memory). Where the pool
    lends sleep/wake's backup, first the backup no paused tag holds goes back to it, then the lending stops.
    RuntimeError while tensors still hold strata's pinned blocks, or a paused tag's backup does."""
    if _lending[0]:
        from . import sleep
        sleep.release_backup()
        _stop_lending()
    if _function("strata_torch_uninstall_pinned", ctypes.c_int, [])() != 0:
        raise RuntimeError(f"strata_torch.disable_pinned: {_last_error()}")


def enable_pinned_from_env(pinned=None):
    """enable()'s `pinned` argument: True installs, False does not, None follows STRATA_TORCH_PINNED=1.
    Returns whether it installed."""
    if pinned is None:
        pinned = os.environ.get(ENV_PINNED, "0") == "1"
    if pinned:
        enable_pinned()
    return bool(pinned)


def pinned_stats():
    """strata's pinned pool in bytes and counts (pin_ns: nanoseconds spent pinning; numa_node: -1 for none),
    or {} before its first allocation."""
    figures = (ctypes.c_ulonglong * len(_FIGURES))()
    n = _function("strata_torch_pinned_figures", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int])(
        ctypes.cast(figures, ctypes.c_void_p), len(_FIGURES))
    stats = {name: int(figures[i]) for i, name in enumerate(_FIGURES[:n])}
    if "numa_node" in stats:
        stats["numa_node"] -= 1
    return stats


def empty_pinned(*size, dtype=None):
    """torch.empty(*size, dtype=dtype, pin_memory=True) from strata's pool, installing it first if needed."""
    import torch
    enable_pinned()
    return torch.empty(*size, dtype=dtype, pin_memory=True)
