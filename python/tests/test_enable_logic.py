"""enable() and MemPool() control flow against a stand-in for the few PyTorch calls they make (is_initialized,
CUDAPluggableAllocator, change_current_allocator, MemPool), with the real plug-in behind them. What PyTorch
itself then does with the allocator is checked on the device (test_torch.py, tests/device/torch/)."""

import os
import shutil
import tempfile
import unittest

import support

# A stand-in `torch` module, installed in sys.modules before strata_torch imports it. SETTERS decides whether
# the allocator object offers PyTorch's hook setters to Python; INITIALIZED whether CUDA already started;
# REFUSE makes change_current_allocator fail the way PyTorch does once its allocator has been used.
FAKE_TORCH = """
import json, sys, types, warnings
calls = []
SETTERS = {setters}
INITIALIZED = {initialized}
REFUSE = {refuse}
class Raw:
    pass
HOOK_NAMES = ["set_init_fn", "set_reset_fn", "set_memory_fraction_fn", "set_record_stream_fn", "set_base_alloc_fn",
              "set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool"]
def make_setter(name):
    return lambda self, address: calls.append(["hook", name, address])
if SETTERS:
    for n in HOOK_NAMES:
        setattr(Raw, n, make_setter(n))
class CUDAPluggableAllocator:
    def __init__(self, path, alloc_fn, free_fn):
        calls.append(["pluggable", alloc_fn, free_fn])
        self._raw = Raw()
    def allocator(self):
        return self._raw
def change_current_allocator(a):
    if REFUSE:
        raise RuntimeError("Can't swap an already initialized allocator")
    calls.append(["change"])
class MemPool:
    def __init__(self, raw=None, use_on_oom=False):
        calls.append(["mempool", use_on_oom] if raw is not None else ["mempool without allocator", use_on_oom])
torch = types.ModuleType("torch")
torch.cuda = types.SimpleNamespace(is_initialized=lambda: INITIALIZED, MemPool=MemPool,
    memory=types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                                 change_current_allocator=change_current_allocator))
sys.modules["torch"] = torch
import strata_torch
from strata_torch import _library
lib = _library.load()
def outcome(fn):
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            value = fn()
        return ["ok", [str(x.message) for x in w]]
    except Exception as e:
        return [type(e).__name__, str(e)]
"""


# A stand-in for libstrata_torch_hooks.so (which needs the real PyTorch): ctypes.CDLL of that name gives an
# object whose strata_torch_wire_hooks() records the call and succeeds.
FAKE_HOOKS_LIBRARY = """
import ctypes
_real_cdll = ctypes.CDLL
class _Wire:
    def __call__(self):
        calls.append(["wire"])
        return 0
class _HooksLibrary:
    def __init__(self):
        self.strata_torch_wire_hooks = _Wire()
ctypes.CDLL = lambda path, *a, **k: _HooksLibrary() if path.endswith("libstrata_torch_hooks.so") else _real_cdll(path, *a, **k)
"""


# A stand-in for a libstrata_torch_hooks.so that offers the complete backend: strata_torch_install_backend()
# records ["install", ...] and returns INSTALL_RESULT (nonzero: it failed, with the plug-in's last error set).
FAKE_BACKEND_LIBRARY = """
import ctypes
_real_cdll = ctypes.CDLL
INSTALL_RESULT = {install_result}
class _Install:
    def __call__(self):
        calls.append(["install"])
        if INSTALL_RESULT != 0:
            lib._cdll.strata_report_error(b"strata_torch_install_backend: Can't swap an already initialized allocator")
        return INSTALL_RESULT
class _BackendLibrary:
    def __init__(self):
        self.strata_torch_install_backend = _Install()
        self.strata_torch_wire_hooks = lambda: calls.append(["wire"]) or 0
ctypes.CDLL = lambda path, *a, **k: _BackendLibrary() if path.endswith("libstrata_torch_hooks.so") else _real_cdll(path, *a, **k)
"""


class EnableLogic(unittest.TestCase):
    def setUp(self):
        self.path = support.find_library()
        if self.path is None:
            support.skip_or_fail(self, "libstrata_alloc.so is not built")

    def scenario(self, body, setters=True, initialized=False, refuse=False, env=None, hooks_library=False,
                 backend_library=None):
        """body runs after FAKE_TORCH, with a copy of the plug-in alone in a directory (a build with PyTorch has
        the real hooks library beside the plug-in, which would act on the real PyTorch). hooks_library=True puts
        a stand-in libstrata_torch_hooks.so there whose strata_torch_wire_hooks() records ["wire"] in calls."""
        code = FAKE_TORCH.format(setters=setters, initialized=initialized, refuse=refuse)
        lonely = tempfile.mkdtemp(prefix="strata-no-hooks-")
        self.addCleanup(shutil.rmtree, lonely, True)
        path = shutil.copy(self.path, lonely)
        if hooks_library:
            open(os.path.join(lonely, "libstrata_torch_hooks.so"), "w").close()
            code += FAKE_HOOKS_LIBRARY
        if backend_library is not None:   # the install's result
            open(os.path.join(lonely, "libstrata_torch_hooks.so"), "w").close()
            code += FAKE_BACKEND_LIBRARY.format(install_result=backend_library)
        rc, out, err = support.run_python(code + body, dict({"STRATA_ALLOC_LIBRARY": path}, **(env or {})))
        self.assertEqual(rc, 0, err)
        self.assertIsNotNone(out, err)
        return out

    def test_every_hook_is_handed_over_with_the_plugins_addresses(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "addresses = {s[0]: lib.address(sym) for s, sym in strata_torch._HOOKS}\n"
            "print(json.dumps(dict(r=r, calls=calls, hooks=strata_torch.hooks(), addresses=addresses,\n"
            "     enabled=strata_torch.is_enabled(), oom=strata_torch.oom_raises_torch_error())))")
        self.assertEqual(out["r"][0], "ok")
        # Hooks set from Python, but no hooks library: out of memory cannot become torch.OutOfMemoryError.
        self.assertEqual(len(out["r"][1]), 1, out["r"][1])
        self.assertIn("not torch.OutOfMemoryError", out["r"][1][0])
        self.assertFalse(out["oom"])
        self.assertEqual(out["calls"][0], ["pluggable", "strata_malloc_or_throw", "strata_free"])
        handed = {name: address for kind, name, address in (c for c in out["calls"] if c[0] == "hook")}
        self.assertEqual(handed, out["addresses"])
        self.assertEqual(len(handed), 8)
        self.assertEqual(out["calls"][-1], ["change"], "hooks must be set before the allocator is swapped in")
        self.assertEqual(set(out["hooks"]), set(handed))
        self.assertTrue(out["enabled"])

    def test_hooks_library_is_wired_even_when_python_sets_the_hooks(self):
        # On the device machine: PyTorch 2.11 offers the setters to Python, the hooks library was never
        # loaded, so its out-of-memory handler was never installed and OOM arrived as a RuntimeError.
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "print(json.dumps(dict(r=r, calls=calls, hooks=strata_torch.hooks(), oom=strata_torch.oom_raises_torch_error())))",
            hooks_library=True)
        self.assertEqual(out["r"], ["ok", []])
        self.assertEqual(out["calls"][-2:], [["change"], ["wire"]], "the hooks library acts on the swapped-in allocator")
        self.assertEqual(sum(1 for c in out["calls"] if c[0] == "hook"), 8)
        self.assertTrue(out["oom"])
        self.assertEqual(out["hooks"]["set_reset_fn"], "strata_reset")

    def test_hooks_library_alone_sets_the_hooks_where_python_cannot(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "print(json.dumps(dict(r=r, calls=calls, hooks=strata_torch.hooks(), oom=strata_torch.oom_raises_torch_error())))",
            setters=False, hooks_library=True)
        self.assertEqual(out["r"], ["ok", []])
        self.assertEqual(out["calls"][-2:], [["change"], ["wire"]])
        self.assertTrue(out["oom"])
        self.assertEqual(len(out["hooks"]), 8)
        self.assertIn("through libstrata_torch_hooks.so", out["hooks"]["set_reset_fn"])

    def test_a_broken_hooks_library_beside_python_setters_is_a_warning(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "print(json.dumps(dict(r=r, calls=calls, oom=strata_torch.oom_raises_torch_error())))",
            env={"STRATA_TORCH_HOOKS_LIBRARY": __file__})   # exists, but is no library
        self.assertEqual(out["r"][0], "ok")
        self.assertEqual(len(out["r"][1]), 1, out["r"][1])
        self.assertIn("does not load", out["r"][1][0])
        self.assertIn(["change"], out["calls"])
        self.assertFalse(out["oom"])

    def test_without_setters_or_hooks_library_nothing_changes(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "print(json.dumps(dict(r=r, calls=calls, enabled=strata_torch.is_enabled())))", setters=False)
        self.assertEqual(out["r"][0], "RuntimeError")
        self.assertIn("libstrata_torch_hooks.so", out["r"][1])
        self.assertIn("require_hooks=False", out["r"][1])
        self.assertNotIn(["change"], out["calls"])
        self.assertFalse(out["enabled"])

    def test_hooks_may_be_waived_with_a_warning(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated', require_hooks=False))\n"
            "print(json.dumps(dict(r=r, calls=calls, hooks=strata_torch.hooks())))", setters=False)
        self.assertEqual(out["r"][0], "ok")
        self.assertEqual(len(out["r"][1]), 1)
        self.assertIn("record_stream() and CUDA graphs bypass strata", out["r"][1][0])
        self.assertIn(["change"], out["calls"])
        self.assertEqual(out["hooks"], {})

    def test_hooks_waived_by_the_environment(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "print(json.dumps(dict(r=r, calls=calls)))", setters=False, env={"STRATA_TORCH_REQUIRE_HOOKS": "0"})
        self.assertEqual(out["r"][0], "ok")
        self.assertIn(["change"], out["calls"])

    def test_a_broken_hooks_library_fails_before_the_swap(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "print(json.dumps(dict(r=r, calls=calls)))", setters=False,
            env={"STRATA_TORCH_HOOKS_LIBRARY": __file__})   # exists, but is no library
        self.assertEqual(out["r"][0], "RuntimeError")
        self.assertIn("does not load", out["r"][1])
        self.assertNotIn(["change"], out["calls"])

    def test_too_late_once_cuda_started(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "print(json.dumps(dict(r=r, calls=calls, in_use=lib.is_in_use())))", initialized=True)
        self.assertEqual(out["r"][0], "RuntimeError")
        self.assertIn("must run before the first CUDA allocation", out["r"][1])
        self.assertIn("MemPool", out["r"][1])
        self.assertEqual(out["calls"], [])

    def test_pytorch_refusing_the_swap_is_explained(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "print(json.dumps(dict(r=r, enabled=strata_torch.is_enabled())))", refuse=True)
        self.assertEqual(out["r"][0], "RuntimeError")
        self.assertIn("must run before the first CUDA allocation", out["r"][1])
        self.assertIn("already initialized allocator", out["r"][1])
        self.assertFalse(out["enabled"])

    def test_bad_configuration_changes_nothing(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated,limit=banana'))\n"
            "print(json.dumps(dict(r=r, calls=calls, value_error=issubclass(strata_torch.ConfigError, ValueError))))")
        self.assertEqual(out["r"][0], "ConfigError")
        self.assertIn("banana", out["r"][1])
        self.assertEqual(out["calls"], [])
        self.assertTrue(out["value_error"])

    def test_enable_twice(self):
        out = self.scenario(
            "a = strata_torch.enable('stack=simulated')\n"
            "same = strata_torch.enable('stack=simulated') is a\n"
            "r = outcome(lambda: strata_torch.enable('stack=simulated,limit=0.5'))\n"
            "print(json.dumps(dict(same=same, r=r, swaps=calls.count(['change']))))")
        self.assertTrue(out["same"])
        self.assertEqual(out["r"][0], "RuntimeError")
        self.assertIn("already enabled", out["r"][1])
        self.assertEqual(out["swaps"], 1)

    def test_the_strata_backend_is_installed_where_the_hooks_library_offers_it(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "same = strata_torch.enable('stack=simulated') is strata_torch.enable('stack=simulated', backend='strata')\n"
            "other = outcome(lambda: strata_torch.enable('stack=simulated', backend='pluggable'))\n"
            "pool = outcome(lambda: strata_torch.MemPool(use_on_oom=True))\n"
            "print(json.dumps(dict(r=r, same=same, other=other, pool=pool, calls=calls, backend=strata_torch.backend(),\n"
            "     oom=strata_torch.oom_raises_torch_error(), hooks=strata_torch.hooks())))", backend_library=0)
        self.assertEqual(out["r"], ["ok", []])
        self.assertEqual(out["backend"], "strata")
        self.assertTrue(out["same"])
        self.assertEqual(out["other"][0], "RuntimeError")   # a process's allocator is chosen once
        self.assertIn("already enabled", out["other"][1])
        # No CUDAPluggableAllocator, no swap through Python, no hooks: the backend is PyTorch's allocator.
        self.assertEqual(out["calls"], [["install"], ["mempool without allocator", True]])
        self.assertTrue(out["oom"])
        self.assertEqual(out["hooks"], {})

    def test_the_pluggable_path_stays_on_request(self):
        for kwargs, env in (("backend='pluggable'", None), ("", {"STRATA_TORCH_BACKEND": "pluggable"})):
            out = self.scenario(
                f"r = outcome(lambda: strata_torch.enable('stack=simulated', {kwargs}))\n"
                "print(json.dumps(dict(r=r, calls=calls, backend=strata_torch.backend())))",
                backend_library=0, env=env)
            self.assertEqual(out["r"][0], "ok")
            self.assertEqual(out["backend"], "pluggable")
            self.assertNotIn(["install"], out["calls"])
            self.assertEqual(out["calls"][-2:], [["change"], ["wire"]])

    def test_a_bad_backend_name_and_a_missing_backend_are_refused(self):
        out = self.scenario(
            "bad = outcome(lambda: strata_torch.enable('stack=simulated', backend='native'))\n"
            "missing = outcome(lambda: strata_torch.enable('stack=simulated', backend='strata'))\n"
            "print(json.dumps(dict(bad=bad, missing=missing, calls=calls, backend=strata_torch.backend())))")
        self.assertEqual(out["bad"][0], "ValueError")
        self.assertIn("'native'", out["bad"][1])
        self.assertEqual(out["missing"][0], "RuntimeError")
        self.assertIn("libstrata_torch_hooks.so", out["missing"][1])
        self.assertIn("backend='pluggable'", out["missing"][1])
        self.assertEqual(out["calls"], [])
        self.assertIsNone(out["backend"])

    def test_a_refused_backend_install_is_explained(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.enable('stack=simulated'))\n"
            "print(json.dumps(dict(r=r, enabled=strata_torch.is_enabled(), backend=strata_torch.backend())))",
            backend_library=1)
        self.assertEqual(out["r"][0], "RuntimeError")
        self.assertIn("must run before the first CUDA allocation", out["r"][1])
        self.assertFalse(out["enabled"])
        self.assertIsNone(out["backend"])

    def test_mempool_uses_the_null_returning_entry_point_and_no_hooks(self):
        out = self.scenario(
            "r = outcome(lambda: strata_torch.MemPool('stack=simulated', use_on_oom=True))\n"
            "print(json.dumps(dict(r=r, calls=calls, hooks=strata_torch.hooks())))")
        self.assertEqual(out["r"][0], "ok")
        self.assertEqual(out["calls"], [["pluggable", "strata_malloc", "strata_free"], ["mempool", True]])
        self.assertEqual(out["hooks"], {})


if __name__ == "__main__":
    unittest.main()
