"""strata as CuPy's allocator: ``strata_torch.cupy.enable("stack=default")``.

CuPy's CFunctionAllocator calls C functions with (param, size, device) and no stream, and takes a null
result as a valid empty pointer. So the allocator CuPy gets is a small Python function around it that
(1) tells the plug-in CuPy's current stream before each allocation (strata_cupy_set_stream, thread-local),
so strata orders the block on the stream the array's work will run on, and (2) turns a null result into
cupy.cuda.memory.OutOfMemoryError, as CuPy's own pool does. Each call costs one Python frame and two C
calls on top of strata's allocation. Frees carry no stream in CuPy's interface: the plug-in frees a block on
the stream it was allocated on, so the block is reused on that stream at once and elsewhere only once that
stream's earlier work is done.
"""

import threading

from . import _library
from . import validate as _validate

_lock = threading.Lock()
_state = {}


def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise ImportError("strata_torch.cupy needs CuPy (pip install cupy-cuda13x)") from e
    return cupy


def make_allocator(conf=None):
    """A function usable as ``cupy.cuda.set_allocator(f)`` (or inside ``cupy.cuda.using_allocator(f)``)."""
    cupy = _cupy()
    lib = _library.load()
    for symbol in ("strata_cupy_malloc", "strata_cupy_free"):
        if not lib.has(symbol):
            raise ImportError(f"{lib.path} has no {symbol}: built without CuPy support")
    if conf is not None:
        _validate(conf)
    elif not lib.is_in_use():
        lib.check_env()   # a bad STRATA_ALLOC_CONF fails here, not at CuPy's first allocation
    c_allocator = cupy.cuda.memory.CFunctionAllocator(
        0, lib.address("strata_cupy_malloc"), lib.address("strata_cupy_free"), lib)
    c_malloc = c_allocator.malloc
    set_stream = lib.cupy_set_stream if lib.has("strata_cupy_set_stream") else None
    get_current_stream = cupy.cuda.get_current_stream
    out_of_memory = cupy.cuda.memory.OutOfMemoryError

    def malloc(size):
        if set_stream is not None:
            set_stream(get_current_stream().ptr)
        pointer = c_malloc(size)
        if size and not pointer.ptr:
            stats = lib.memory_stats(cupy.cuda.runtime.getDevice())
            raise out_of_memory(size, stats.get("allocated_bytes.all.current", 0))
        return pointer

    malloc.strata_allocator = c_allocator   # keeps the CFunctionAllocator (and the library) alive
    return malloc


def enable(conf=None):
    """Route every CuPy allocation of this process through strata (cupy.cuda.set_allocator). Returns the
    allocator function. conf as for strata_torch.enable (None: STRATA_ALLOC_CONF or the default)."""
    cupy = _cupy()
    with _lock:
        allocator = make_allocator(conf)
        cupy.cuda.set_allocator(allocator)
        _state["allocator"] = allocator
        return allocator


def disable():
    """Give CuPy its own memory pool back (blocks strata served stay valid and are freed to strata)."""
    cupy = _cupy()
    with _lock:
        cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)
        _state.pop("allocator", None)
