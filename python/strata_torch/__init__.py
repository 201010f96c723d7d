"""strata as PyTorch's CUDA allocator.

    import strata_torch
    strata_torch.enable("stack=default,limit=0.9")   # before the first CUDA allocation
    ...                                              # train as usual; torch.cuda.memory_stats(),
                                                     # memory_snapshot(), CUDA graphs ... all reach strata
    print(strata_torch.memory_summary())             # strata's own figures

enable() installs strata as PyTorch's complete CUDA allocator backend (libstrata_torch_hooks.so, built against
this PyTorch's headers) where it can; otherwise, and for backend="pluggable", through PyTorch's
CUDAPluggableAllocator, under which torch.cuda's memory functions raise. backend() says which is in use.

Scoped use instead of process-wide: ``with torch.cuda.use_mem_pool(strata_torch.MemPool()): ...``.
CuPy: ``strata_torch.cupy.enable(conf)``.

torch is imported lazily, inside the functions that need it, so configuration checks, statistics and the
summary work where PyTorch is not installed.
"""

import ctypes
import os
import sys
import threading
import warnings

from . import _library, _stats
from ._library import ConfigError, library_path
from ._stats import format_bytes
from . import pinned as pinned_module
from .pinned import disable_pinned, empty_pinned, enable_pinned, lend_pinned, pinned_stats
from .sleep import current_tag, pause, release_backup, reserve_backup, resume, tag, tag_id, tag_stats

__all__ = ["enable", "is_enabled", "backend", "MemPool", "memory_stats", "memory_summary", "reset_peak_memory_stats",
           "snapshot", "empty_cache", "record", "flush_record", "library_path", "validate", "hooks",
           "oom_raises_torch_error",
           "ConfigError", "format_bytes", "peak_ratio",
           "tag", "tag_id", "current_tag", "pause", "resume", "reserve_backup", "release_backup", "tag_stats",
           "enable_pinned", "disable_pinned", "empty_pinned", "pinned_stats", "lend_pinned"]

DEFAULT_CONF = "stack=default"
BACKENDS = ("strata", "pluggable")
ENV_BACKEND = "STRATA_TORCH_BACKEND"

# PyTorch's setter on the allocator object -> the plug-in's symbol. Several setter spellings per hook: PyTorch
# 2.11 names them as in the first column; a later rename is picked up without a change here.
_HOOKS = [
    (("set_init_fn",), "strata_init"),
    (("set_reset_fn",), "strata_reset"),
    (("set_memory_fraction_fn",), "strata_set_memory_fraction"),
    (("set_record_stream_fn",), "strata_record_stream"),
    (("set_base_alloc_fn",), "strata_base_alloc"),
    (("set_begin_allocate_to_pool", "set_begin_allocate_to_pool_fn"), "strata_begin_allocate_to_pool"),
    (("set_end_allocate_to_pool_fn", "set_end_allocate_to_pool"), "strata_end_allocate_to_pool"),
    (("set_release_pool", "set_release_pool_fn"), "strata_release_pool"),
]

_lock = threading.Lock()
_allocators = {}      # "process" / "pool" -> torch.cuda.memory.CUDAPluggableAllocator
_wired = {}            # setter name -> symbol, for the hooks handed to PyTorch
_hooks_library = []    # libstrata_torch_hooks.so once loaded
_enabled_conf = None   # the configuration enable() applied (None: not enabled process-wide)
_state = {"oom_raises_torch_error": False,  # the hooks library's out-of-memory handler is installed
          "backend": None}                 # "strata" or "pluggable" once enable() succeeded
_applied_conf = None   # the last configuration applied by this module, by any function


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("strata_torch needs PyTorch for this (pip install torch); the statistics and "
                          "configuration functions work without it") from e
    return torch


def validate(conf):
    """Apply a configuration string to the plug-in now, before any stack exists.

    ConfigError (a ValueError) naming the bad key or value. RuntimeError if the stacks were already built
    (the configuration can no longer change). O(length of conf); no CUDA call.
    """
    global _applied_conf
    lib = _library.load()
    if lib.is_in_use():
        if conf == _applied_conf:
            return
        raise RuntimeError(f"strata: the allocator is already in use with {_applied_conf or 'its first'} "
                           f"configuration; {conf!r} must be given before the first CUDA allocation")
    lib.configure(conf)
    _applied_conf = conf


def _apply(conf):
    """conf, or STRATA_ALLOC_CONF when conf is None (checked now, so a bad one fails here, not at first use)."""
    if conf is None:
        lib = _library.load()
        if not lib.is_in_use():
            lib.check_env()
        return
    validate(conf)


def _pluggable_allocator(process_wide):
    """A CUDAPluggableAllocator over the plug-in (one of each kind per process).

    Process-wide (change_current_allocator) PyTorch 2.11 does not check the allocation function's result, so
    a null would become a tensor without memory: that allocator uses strata_malloc_or_throw, whose failure
    reaches Python as an exception. Under a MemPool PyTorch's caching allocator checks for null itself and
    raises torch.OutOfMemoryError, so that one uses strata_malloc. Every optional hook PyTorch offers is wired
    on the process-wide one (the caching allocator never calls a pool allocator's hooks).
    """
    key = "process" if process_wide else "pool"
    if key in _allocators:
        return _allocators[key]
    torch = _torch()
    lib = _library.load()
    alloc_fn = "strata_malloc_or_throw" if process_wide and lib.has("strata_malloc_or_throw") else "strata_malloc"
    allocator = torch.cuda.memory.CUDAPluggableAllocator(lib.path, alloc_fn, "strata_free")
    if process_wide:
        raw = allocator.allocator()
        for setters, symbol in _HOOKS:
            setter = next((s for s in setters if hasattr(raw, s)), None)
            if setter is not None and lib.has(symbol):
                getattr(raw, setter)(lib.address(symbol))
                _wired[setter] = symbol
    _allocators[key] = allocator
    return allocator


class StrataBackend:
    """What enable() returns when strata is PyTorch's allocator backend (torch.cuda.memory.get_allocator_backend()
    then says "strata"): every torch.cuda memory function reaches strata's stacks."""

    name = "strata"

    def __repr__(self):
        return "StrataBackend()"


def _chosen_backend(backend):
    if backend is None:
        backend = os.environ.get(ENV_BACKEND) or None
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"strata_torch.enable: backend {backend!r} is not one of {', '.join(BACKENDS)} "
                         f"(or None: strata's backend where this build has it, else pluggable)")
    return backend


def _hooks_function(name, failure):
    """(library, function, None) for `name` in libstrata_torch_hooks.so beside the loaded libstrata_alloc.so, or
    (None, None, why) naming the missing file or symbol; `failure` words the second case."""
    lib = _library.load()
    path = _library.hooks_library_path(lib.path)
    if path is None:
        return None, None, f"{_library.HOOKS_LIBRARY_NAME} was not found beside {lib.path}"
    try:
        hooks_lib = ctypes.CDLL(path)
        return hooks_lib, getattr(hooks_lib, name), None
    except (OSError, AttributeError) as e:
        return None, None, f"{path} {failure}: {e}"


def _backend_installer(required):
    """libstrata_torch_hooks.so's strata_torch_install_backend, or None (with the reason) where the library is
    missing or predates the backend. required: raise instead of returning None."""
    hooks_lib, install, why = _hooks_function("strata_torch_install_backend", "offers no strata backend")
    if why is not None:
        if required:
            raise RuntimeError(f"strata_torch.enable(backend='strata'): {why}. Build it where PyTorch is installed "
                               "(CMAKE_PREFIX_PATH=torch.utils.cmake_prefix_path, see docs/pytorch.md), or pass "
                               "backend='pluggable'")
        return None
    install.restype, install.argtypes = ctypes.c_int, []
    _hooks_library.append(hooks_lib)   # kept loaded: PyTorch holds the allocator it made
    return install


def enable(conf=DEFAULT_CONF, require_hooks=None, backend=None, pinned=None):
    """Make strata the CUDA allocator of this whole process. Must run before the first CUDA allocation.

    conf: a configuration string ("stack=default,limit=0.9,record=trace.csv.gz"); None takes STRATA_ALLOC_CONF.
    Checked first: ConfigError (a ValueError) names the bad key or value. RuntimeError when CUDA was
    already initialized here (PyTorch cannot swap an allocator that has served memory). Calling it again
    with the same conf does nothing; with another, RuntimeError.
    require_hooks: where PyTorch keeps the hook setters from Python and libstrata_torch_hooks.so is missing,
    RuntimeError before anything changes (without the hooks, record_stream() and CUDA graphs would bypass
    strata); False allows it, with a warning. None: STRATA_TORCH_REQUIRE_HOOKS=0 in the environment means False,
    anything else True.
    backend: "strata" installs strata as PyTorch's complete allocator backend (every torch.cuda memory function,
    CUDA graphs, torch.compile's graph trees and torch.OutOfMemoryError reach it; needs libstrata_torch_hooks.so
    built against this PyTorch); "pluggable" uses torch.cuda.memory.CUDAPluggableAllocator (kept for PyTorch
    builds the backend cannot be built against: torch.cuda's statistics raise under it); None:
    STRATA_TORCH_BACKEND, else "strata" where the hooks library offers it, else "pluggable". backend() says
    which one is in use. Returns a StrataBackend, or the CUDAPluggableAllocator.
    pinned: True also makes strata's pinned pool PyTorch's pinned-memory allocator (enable_pinned), first, and,
    once the allocator is in place, lends that pool to sleep/wake's backup (lend_pinned), so a process that
    pauses tags and pins tensors pins once; None: STRATA_TORCH_PINNED=1 in the environment means True.
    disable_pinned() undoes both.
    """
    installed = pinned_module.enable_pinned_from_env(pinned)
    allocator = _enable_allocator(conf, require_hooks, backend)
    if installed:
        pinned_module.lend_pinned()
    return allocator


def _enable_allocator(conf, require_hooks, backend):
    """enable() less the pinned pool: strata as the process's CUDA allocator."""
    global _enabled_conf
    if require_hooks is None:
        require_hooks = os.environ.get("STRATA_TORCH_REQUIRE_HOOKS", "1") != "0"
    backend = _chosen_backend(backend)
    torch = _torch()
    with _lock:
        if _enabled_conf is not None:
            if conf == _enabled_conf and backend in (None, _state["backend"]):
                return _allocators["process"]
            raise RuntimeError(f"strata_torch.enable: already enabled with {_enabled_conf!r} "
                               f"({_state['backend']} backend); the allocator of a process is chosen once, so "
                               f"{conf!r} ({backend or 'any'} backend) cannot replace it")
        if torch.cuda.is_initialized():
            raise RuntimeError(_too_late("CUDA is already initialized in this process"))
        _apply(conf)
        if backend != "pluggable":
            install = _backend_installer(required=backend == "strata")
            if install is not None:
                if install() != 0:
                    message = _library.load().last_error()
                    if "initialized" in message:
                        raise RuntimeError(_too_late(f"PyTorch refused: {message}"))
                    raise RuntimeError(f"strata_torch: installing the strata backend failed: {message}")
                _allocators["process"] = StrataBackend()
                _enabled_conf = conf
                _state["backend"] = "strata"
                _state["oom_raises_torch_error"] = True
                return _allocators["process"]
        # PyTorch's own allocator settings reach strata here on this path (the strata backend reads them itself
        # when CUDA starts): checked before the allocator is swapped, so a refusal changes nothing.
        torch_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF"))
        if torch_conf:
            for note in _library.load().apply_torch_conf(torch_conf):
                warnings.warn(f"strata: {note}", RuntimeWarning, stacklevel=3)
        allocator = _pluggable_allocator(process_wide=True)
        # The hooks library is loaded even where Python could set the hooks itself: it alone can make the
        # plug-in's out-of-memory a torch.OutOfMemoryError (PyTorch turns any other C++ exception into a
        # RuntimeError), so without it an out-of-memory would escape `except torch.OutOfMemoryError`.
        wire = _hooks_library_wire(require_hooks, hooks_set_from_python=bool(_wired))
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            if "already initialized" in str(e):
                raise RuntimeError(_too_late(f"PyTorch refused: {e}")) from e
            raise
        _enabled_conf = conf
        _state["backend"] = "pluggable"
        if wire is not None:
            if wire() != 0:
                raise RuntimeError(f"strata_torch: {_library.HOOKS_LIBRARY_NAME} could not set the allocator "
                                   f"hooks: {_library.load().last_error()}")
            _state["oom_raises_torch_error"] = True
            if not _wired:
                for setters, symbol in _HOOKS:
                    _wired[setters[0]] = f"{symbol} (through {_library.HOOKS_LIBRARY_NAME})"
        return allocator


def _hooks_library_wire(required, hooks_set_from_python=False):
    """The small C++ library built against PyTorch's headers: its strata_torch_wire_hooks sets the hooks on the
    current allocator (which Python cannot where PyTorch's objects lack the set_*_fn methods) and installs the
    plug-in's out-of-memory handler that throws c10::OutOfMemoryError. Returns that function, loaded now (so a
    missing or broken library fails before the allocator is swapped), to be called after the swap.
    With the hooks already set from Python, a missing library costs only the error's type: a warning."""
    hooks_lib, wire, problem = _hooks_function("strata_torch_wire_hooks", "does not load")
    if problem is not None and hooks_set_from_python:
        warnings.warn(f"strata_torch: {problem}; out of memory under strata will then raise RuntimeError, not "
                      "torch.OutOfMemoryError. Build it where PyTorch is installed (CMAKE_PREFIX_PATH="
                      "torch.utils.cmake_prefix_path, see docs/pytorch.md)", RuntimeWarning, stacklevel=4)
        return None
    if problem is not None:
        message = (f"strata_torch: this PyTorch does not let Python set the allocator's hooks, and {problem}. "
                   "Build it where PyTorch is installed (CMAKE_PREFIX_PATH=torch.utils.cmake_prefix_path, see "
                   "docs/pytorch.md). Without it empty_cache(), record_stream() and CUDA graphs bypass strata")
        if required:
            raise RuntimeError(message + "; enable(conf, require_hooks=False) or STRATA_TORCH_REQUIRE_HOOKS=0 "
                               "accepts that")
        warnings.warn(message, RuntimeWarning, stacklevel=4)
        return None
    wire.restype, wire.argtypes = ctypes.c_int, []
    _hooks_library.append(hooks_lib)   # kept loaded: PyTorch will hold pointers into it
    return wire


def _too_late(why):
    return (f"strata_torch.enable() must run before the first CUDA allocation (before any tensor on the GPU, "
            f"torch.cuda.init() or a CUDA call through torch): {why}. Call it at the top of the program, or set "
            f"STRATA_ALLOC_CONF and call it before anything else touches CUDA; for scoped use in a running "
            f"process use strata_torch.MemPool() with torch.cuda.use_mem_pool")


def is_enabled():
    """True once enable() made strata this process's allocator."""
    return _enabled_conf is not None


def backend():
    """"strata" (strata is PyTorch's complete allocator backend), "pluggable" (through CUDAPluggableAllocator)
    or None (enable() has not run)."""
    return _state["backend"]


def oom_raises_torch_error():
    """True once enable() installed the hooks library's handler: strata's out-of-memory then raises
    torch.OutOfMemoryError (else a RuntimeError naming the out-of-memory)."""
    return _state["oom_raises_torch_error"]


def hooks():
    """{PyTorch setter: plug-in symbol} for every optional hook handed to PyTorch on the pluggable path (empty
    before use, and under strata's backend, which needs none)."""
    return dict(_wired)


def MemPool(conf=None, use_on_oom=False):
    """A torch.cuda.MemPool whose segments come from strata: ``with torch.cuda.use_mem_pool(pool): ...``.

    PyTorch's caching allocator stays in charge of the blocks inside the pool and asks strata for the
    memory under them; works in a process where CUDA is already initialized. conf as for enable(), but it
    can only be set before strata serves its first allocation (None: keep the current configuration).
    Where enable() made strata the allocator backend, strata serves every pool itself: this is then a plain
    torch.cuda.MemPool (conf must be None or enable()'s).
    """
    torch = _torch()
    with _lock:
        if _state["backend"] == "strata":
            if conf is not None and conf != _enabled_conf:
                raise RuntimeError(f"strata_torch.MemPool: strata already serves this process with "
                                   f"{_enabled_conf!r}; a pool cannot have its own configuration {conf!r}")
            return torch.cuda.MemPool(use_on_oom=use_on_oom)
        if conf is not None:
            validate(conf)
        else:
            _apply(None)
        allocator = _pluggable_allocator(process_wide=False)
    return torch.cuda.MemPool(allocator.allocator(), use_on_oom=use_on_oom)


def _device_index(device):
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
        return 0
    if isinstance(device, bool):
        raise TypeError(f"device must be an int, 'cuda:N' or a torch.device, not {device!r}")
    if isinstance(device, int):
        index = device
    elif isinstance(device, str):
        text = device[len("cuda:"):] if device.startswith("cuda:") else device
        if device == "cuda":
            return _device_index(None)
        if not text.isdigit():
            raise ValueError(f"device {device!r}: expected an index, 'cuda' or 'cuda:N'")
        index = int(text)
    elif hasattr(device, "type") and hasattr(device, "index"):   # torch.device, without importing torch
        if device.type != "cuda":
            raise ValueError(f"device {device}: strata serves CUDA devices only")
        return _device_index(None) if device.index is None else device.index
    else:
        raise TypeError(f"device must be an int, 'cuda:N' or a torch.device, not {device!r}")
    if index < 0:
        raise ValueError(f"device index must be >= 0, not {index}")
    return index


def memory_stats(device=None):
    """strata's statistics for one device, flat and sorted like torch.cuda.memory_stats(), with PyTorch's key
    names where the meaning is the same ("reserved_bytes.all.current", "allocated_bytes.all.peak", "num_ooms"
    ...) and strata's own under "strata.*". One C call that takes the plug-in's lock; no CUDA call."""
    return _stats.flatten(_library.load().memory_stats(_device_index(device)))


def memory_summary(device=None):
    """A readable table of memory_stats(device)."""
    index = _device_index(device)
    return _stats.summary(memory_stats(index), index)


def peak_ratio(device=None):
    """Peak reserved / peak allocated for the device (None before anything was allocated)."""
    return _stats.peak_ratio(memory_stats(device))


def reset_peak_memory_stats(device=None):
    """Peaks start again from the current values (like torch.cuda.reset_peak_memory_stats())."""
    _library.load().reset_peak_stats(_device_index(device))


def snapshot(device=None):
    """Every chunk and block of the device's stack, as a dict (strata's to_json format)."""
    return _library.load().snapshot(_device_index(device))


def empty_cache():
    """Hand wholly free memory back to CUDA.

    Through torch.cuda.empty_cache() when torch is in use: under enable() that reaches strata through the
    reset hook; under a MemPool it first returns PyTorch's cached pool segments to strata, and strata then
    releases them here. Without torch, strata's release directly.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        if is_enabled() and (_state["backend"] == "strata" or "set_reset_fn" in _wired):
            return
    _library.load().reset()


def record(path, conf=None):
    """Record every allocation and free to a trace file (replayable with strata's tools).

    Recording is part of the configuration, fixed when strata serves its first allocation: so this must be
    called before that, like enable(); it applies ``conf + ",record=" + path`` (conf defaults to the one last
    applied, else stack=default). Afterwards pass ``record=PATH`` in enable()'s conf or STRATA_ALLOC_CONF.
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"record: a file path is needed, not {path!r}")
    if _library.load().is_in_use():
        raise RuntimeError("strata: record() must be called before the first CUDA allocation served by strata; "
                           f"start the process with STRATA_ALLOC_CONF='stack=default,record={path}' or pass "
                           f"record={path} in enable()'s conf")
    base = conf or _applied_conf or DEFAULT_CONF
    parts = [p for p in base.split(",") if p and not p.startswith("record=")]
    validate(",".join(parts + [f"record={os.fspath(path)}"]))


def flush_record():
    """Write the recorder's buffered trace to its file now (it is also flushed at exit)."""
    _library.load().record_flush()
