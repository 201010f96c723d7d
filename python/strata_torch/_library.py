"""Finding and loading libstrata_alloc.so, and typed ctypes access to its C entry points.

Pure Python (ctypes only): importing this never imports torch or CuPy, so configuration checks, statistics
and the summary work, and are tested, on machines without either. The C ABI is described in the plug-in's
header, plugin/include/strata_alloc.h.
"""

import ctypes
import glob
import json
import os
import threading

LIBRARY_NAME = "libstrata_alloc.so"
ENV_LIBRARY = "STRATA_ALLOC_LIBRARY"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# python/strata_torch/ -> the repository root, for a source checkout with a CMake build tree beside it.
_REPO_ROOT = os.path.dirname(os.path.dirname(_PACKAGE_DIR))


HOOKS_LIBRARY_NAME = "libstrata_torch_hooks.so"
ENV_HOOKS_LIBRARY = "STRATA_TORCH_HOOKS_LIBRARY"


class ConfigError(ValueError):
    """A configuration string the plug-in refused; the message is the plug-in's, naming the key or value."""


def _build_tree_candidates(root):
    # Any CMake build directory at the top of a checkout (build, build-release, build-py, ...): the newest
    # library wins, since that is the one a developer just built.
    found = glob.glob(os.path.join(root, "build*", "plugin", LIBRARY_NAME))
    found += glob.glob(os.path.join(root, "build*", "plugin", "*", LIBRARY_NAME))
    return sorted(found, key=os.path.getmtime, reverse=True)


def candidate_paths(env=None, package_dir=None, repo_root=None):
    """Every place library_path() looks, in order: the environment variable, the installed package, build trees."""
    env = os.environ if env is None else env
    package_dir = _PACKAGE_DIR if package_dir is None else package_dir
    repo_root = _REPO_ROOT if repo_root is None else repo_root
    paths = []
    if env.get(ENV_LIBRARY):
        paths.append(env[ENV_LIBRARY])
    paths.append(os.path.join(package_dir, LIBRARY_NAME))
    paths += _build_tree_candidates(repo_root)
    return paths


def library_path(env=None, package_dir=None, repo_root=None):
    """The path of libstrata_alloc.so.

    STRATA_ALLOC_LIBRARY, when set, must name an existing file (a typo there is an error, never a silent
    fall-back to another copy). Otherwise the copy installed inside this package (pip install), else the
    newest one in a build*/plugin/ directory of the source checkout this package lives in.
    Raises FileNotFoundError listing where it looked.
    """
    env = os.environ if env is None else env
    explicit = env.get(ENV_LIBRARY)
    if explicit:
        if not os.path.isfile(explicit):
            raise FileNotFoundError(f"{ENV_LIBRARY}={explicit!r}: no such file")
        return os.path.abspath(explicit)
    paths = candidate_paths(env, package_dir, repo_root)
    for path in paths:
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise FileNotFoundError(
        f"{LIBRARY_NAME} not found; looked in: {', '.join(paths)}. Install the package (pip install .), "
        f"build the CMake target strata_alloc, or set {ENV_LIBRARY} to the library's path")


def hooks_library_path(alloc_path, env=None):
    """libstrata_torch_hooks.so (built against PyTorch's headers; sets the allocator hooks PyTorch 2.11 keeps
    out of Python's reach): STRATA_TORCH_HOOKS_LIBRARY, else beside libstrata_alloc.so. None if absent."""
    env = os.environ if env is None else env
    explicit = env.get(ENV_HOOKS_LIBRARY)
    if explicit:
        if not os.path.isfile(explicit):
            raise FileNotFoundError(f"{ENV_HOOKS_LIBRARY}={explicit!r}: no such file")
        return os.path.abspath(explicit)
    beside = os.path.join(os.path.dirname(alloc_path), HOOKS_LIBRARY_NAME)
    if os.path.isfile(beside):
        return beside
    found = glob.glob(os.path.join(os.path.dirname(alloc_path), "**", HOOKS_LIBRARY_NAME), recursive=True)
    return found[0] if found else None


class _TagFigures(ctypes.Structure):
    """strata_alloc.h's strata_tag_figures."""
    _fields_ = [("physical", ctypes.c_size_t), ("in_use", ctypes.c_size_t), ("paused_bytes", ctypes.c_size_t),
                ("paused", ctypes.c_int)]


# (name, restype, argtypes, required). Optional symbols are the hooks PyTorch may be given; a library
# without one still loads, and the hook is simply not wired.
_VOIDP, _SIZE, _INT, _DOUBLE, _CHARP = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_double, ctypes.c_char_p
_PROTOTYPES = [
    ("strata_malloc", _VOIDP, [_SIZE, _INT, _VOIDP], True),
    ("strata_free", None, [_VOIDP, _SIZE, _INT, _VOIDP], True),
    # Throws a C++ exception on failure: only for PyTorch's process-wide path, never called through ctypes.
    ("strata_malloc_or_throw", None, None, False),
    ("strata_configure", _INT, [_CHARP], True),
    ("strata_check_env", _INT, [], True),
    ("strata_last_error", _CHARP, [], True),
    ("strata_is_in_use", _INT, [], True),
    ("strata_memory_stats_json", _SIZE, [_INT, _CHARP, _SIZE], True),
    ("strata_reset_peak_stats", None, [_INT], True),
    ("strata_snapshot_json", _SIZE, [_INT, _CHARP, _SIZE], True),
    ("strata_record_flush", _INT, [], True),
    ("strata_apply_torch_conf", _INT, [_CHARP], False),
    ("strata_init", None, [_INT], False),
    ("strata_reset", None, [], False),
    ("strata_set_memory_fraction", None, [_DOUBLE, _INT], False),
    ("strata_record_stream", None, [_VOIDP, _VOIDP], False),
    ("strata_base_alloc", _VOIDP, [_VOIDP, ctypes.POINTER(_SIZE)], False),
    ("strata_begin_allocate_to_pool", None, None, False),   # C++ arguments (MempoolId_t, std::function):
    ("strata_end_allocate_to_pool", None, None, False),     # only their addresses are handed to PyTorch
    ("strata_release_pool", None, None, False),
    # Sleep and wake by tag (docs/sleep_wake.md): optional, so an older library still loads.
    ("strata_tag_begin", None, [ctypes.c_uint], False),
    ("strata_tag_end", None, [], False),
    ("strata_current_tag", ctypes.c_uint, [], False),
    ("strata_pause", _INT, [ctypes.POINTER(ctypes.c_uint), _SIZE, _INT], False),
    ("strata_resume", _INT, [ctypes.POINTER(ctypes.c_uint), _SIZE], False),
    ("strata_reserve_backup", _INT, [_INT, _SIZE], False),
    ("strata_release_backup", _SIZE, [], False),
    ("strata_tag_figures_get", _INT, [_INT, ctypes.c_uint, _VOIDP], False),
    ("strata_cupy_malloc", _VOIDP, [_VOIDP, _SIZE, _INT], False),
    ("strata_cupy_free", None, [_VOIDP, _VOIDP, _INT], False),
    ("strata_cupy_set_stream", None, [_VOIDP], False),
]


class Library:
    """The loaded plug-in. Each method is one C call (no CUDA call unless the C function makes one)."""

    def __init__(self, path):
        self.path = path
        self._cdll = ctypes.CDLL(path)
        self._functions = {}
        missing = []
        for name, restype, argtypes, required in _PROTOTYPES:
            try:
                fn = getattr(self._cdll, name)
            except AttributeError:
                if required:
                    missing.append(name)
                continue
            fn.restype = restype
            if argtypes is not None:
                fn.argtypes = argtypes
            self._functions[name] = fn
        if missing:
            raise ImportError(f"{path} lacks the C entry points {', '.join(missing)}: not a strata plug-in, "
                              "or one older than this Python package")

    def has(self, name):
        return name in self._functions

    def address(self, name):
        """The function's address, as PyTorch's set_*_fn and CuPy's CFunctionAllocator take it."""
        return ctypes.cast(self._functions[name], ctypes.c_void_p).value

    def last_error(self):
        message = self._functions["strata_last_error"]()
        return message.decode("utf-8", "replace") if message else ""

    def configure(self, conf):
        """Validate and apply a configuration string; ConfigError (a ValueError) with the plug-in's message."""
        if not isinstance(conf, str):
            raise TypeError(f"conf must be a str like 'stack=default,limit=0.9', not {type(conf).__name__}")
        if self._functions["strata_configure"](conf.encode("utf-8")) != 0:
            raise ConfigError(f"strata: bad configuration {conf!r}: {self.last_error()}")

    def check_env(self):
        if self._functions["strata_check_env"]() != 0:
            raise ConfigError(f"strata: bad STRATA_ALLOC_CONF={os.environ.get('STRATA_ALLOC_CONF', '')!r}: "
                              f"{self.last_error()}")

    def is_in_use(self):
        return bool(self._functions["strata_is_in_use"]())

    def apply_torch_conf(self, text):
        """PyTorch's allocator settings (PYTORCH_CUDA_ALLOC_CONF's text) applied to strata. Returns the settings
        that have no effect under strata, one message each; ConfigError (a ValueError) for one strata refuses."""
        if not self.has("strata_apply_torch_conf"):
            return []
        status = self._functions["strata_apply_torch_conf"](text.encode("utf-8"))
        if status < 0:
            raise ConfigError(f"strata: {self.last_error()}")
        return self.last_error().splitlines() if status == 1 else []

    def _json(self, name, device):
        fn = self._functions[name]
        # The C side reports the length it needs; a second call with a buffer that size cannot come up short
        # unless the state grew in between, hence the loop.
        size = 4096
        while True:
            buf = ctypes.create_string_buffer(size + 1)
            needed = fn(device, buf, size + 1)
            if needed <= size:
                return json.loads(buf.value.decode("utf-8"))
            size = needed

    def memory_stats(self, device):
        return self._json("strata_memory_stats_json", device)

    def snapshot(self, device):
        return self._json("strata_snapshot_json", device)

    def reset_peak_stats(self, device):
        self._functions["strata_reset_peak_stats"](device)

    def record_flush(self):
        if self._functions["strata_record_flush"]() != 0:
            raise RuntimeError(f"strata: flushing the trace failed: {self.last_error()}")

    def malloc(self, size, device=0, stream=None):
        return self._functions["strata_malloc"](size, device, stream)

    def free(self, ptr, size, device=0, stream=None):
        self._functions["strata_free"](ptr, size, device, stream)

    def reset(self):
        if self.has("strata_reset"):
            self._functions["strata_reset"]()

    def _sleep_function(self, name):
        if name not in self._functions:
            raise RuntimeError(f"strata: {self.path} has no {name}: a plug-in older than sleep and wake by tag")
        return self._functions[name]

    def _tag_call(self, name, tags, *rest):
        ids = (ctypes.c_uint * len(tags))(*tags)
        if self._sleep_function(name)(ids, len(tags), *rest) != 0:
            message = self.last_error()
            if "out of memory" in message:
                raise MemoryError(f"strata: {message}")
            raise RuntimeError(f"strata: {message}")

    def tag_begin(self, tag):
        self._sleep_function("strata_tag_begin")(tag)

    def tag_end(self):
        self._sleep_function("strata_tag_end")()

    def current_tag(self):
        return int(self._sleep_function("strata_current_tag")())

    def pause(self, tags, backup=True):
        """Pauses the tags (integers) on every device: RuntimeError with the plug-in's message on failure."""
        self._tag_call("strata_pause", tags, 1 if backup else 0)

    def resume(self, tags):
        """Resumes the tags: MemoryError when they do not fit (they stay paused), RuntimeError otherwise."""
        self._tag_call("strata_resume", tags)

    def reserve_backup(self, device, size):
        if self._sleep_function("strata_reserve_backup")(device, size) != 0:
            raise RuntimeError(f"strata: reserve_backup: {self.last_error()}")

    def release_backup(self):
        return int(self._sleep_function("strata_release_backup")())

    def tag_figures(self, device, tag):
        """{physical, in_use, paused_bytes, paused} of one tag on one device (zeros where it has no stack)."""
        out = _TagFigures()
        if self._sleep_function("strata_tag_figures_get")(device, tag, ctypes.byref(out)) < 0:
            raise ValueError(f"strata: {self.last_error()}")
        return {"physical": out.physical, "in_use": out.in_use, "paused_bytes": out.paused_bytes, "paused": bool(out.paused)}

    def cupy_set_stream(self, stream_ptr):
        self._functions["strata_cupy_set_stream"](stream_ptr)


_lock = threading.Lock()
_loaded = None


def load(path=None):
    """The process's one Library (the plug-in keeps per-process state: loading two copies would split it)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = Library(path or library_path())
        elif path is not None and os.path.realpath(path) != os.path.realpath(_loaded.path):
            raise RuntimeError(f"strata: {_loaded.path} is already loaded in this process; cannot switch to {path}")
        return _loaded
