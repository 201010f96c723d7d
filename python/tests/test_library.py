"""The ctypes layer against the built plug-in, over stack=simulated (pretend memory: no GPU needed).

Each scenario runs in a fresh interpreter, since the plug-in's configuration is fixed per process once a
stack exists. Skips (saying so) where the library was not built; fails instead under STRATA_REQUIRE_GPU=1.
"""

import unittest

import support

PRELUDE = "import json, strata_torch\nfrom strata_torch import _library\nlib = _library.load()\n"


class PluginLibrary(unittest.TestCase):
    def setUp(self):
        self.path = support.find_library()
        if self.path is None:
            support.skip_or_fail(self, "libstrata_alloc.so is not built (CMake target strata_alloc)")
        self.env = {"STRATA_ALLOC_LIBRARY": self.path}

    def run_scenario(self, body, env=None):
        rc, out, err = support.run_python(PRELUDE + body, dict(self.env, **(env or {})))
        self.assertEqual(rc, 0, f"scenario failed:\n{err}")
        self.assertIsNotNone(out, f"scenario printed no JSON:\n{err}")
        return out

    def test_required_entry_points_resolve(self):
        out = self.run_scenario("print(json.dumps([lib.has(n) for n in ('strata_malloc', 'strata_free', "
                                "'strata_configure', 'strata_memory_stats_json')]))")
        self.assertEqual(out, [True, True, True, True])

    def test_good_configurations_are_accepted(self):
        out = self.run_scenario(
            "ok = []\n"
            "for conf in ('stack=simulated', 'stack=simulated,limit=0.5', 'stack=simulated,limit=40GiB',\n"
            "             'stack=simulated,release_on_oom=false'):\n"
            "    strata_torch.validate(conf); ok.append(conf)\n"
            "print(json.dumps(ok))")
        self.assertEqual(len(out), 4)

    def test_bad_configurations_name_the_key_or_value(self):
        out = self.run_scenario(
            "res = {}\n"
            "for conf in ('stack=bogus_stack', 'frobnicate=1', 'stack=simulated,limit=1.5', 'limit=-3',\n"
            "             'stack=simulated,release_on_oom=maybe'):\n"
            "    try:\n        lib.configure(conf); res[conf] = None\n"
            "    except strata_torch.ConfigError as e:\n        res[conf] = [str(e), isinstance(e, ValueError)]\n"
            "print(json.dumps(res))")
        expected_words = {"stack=bogus_stack": "bogus_stack", "frobnicate=1": "frobnicate",
                          "stack=simulated,limit=1.5": "1.5", "limit=-3": "-3",
                          "stack=simulated,release_on_oom=maybe": "maybe"}
        for conf, word in expected_words.items():
            self.assertIsNotNone(out[conf], f"{conf!r} was accepted")
            message, is_value_error = out[conf]
            self.assertIn(word, message, f"{conf!r}: message does not name {word!r}: {message}")
            self.assertTrue(is_value_error)

    def test_bad_environment_variable_fails_at_check(self):
        out = self.run_scenario(
            "try:\n    lib.check_env(); print(json.dumps(None))\n"
            "except strata_torch.ConfigError as e:\n    print(json.dumps(str(e)))",
            env={"STRATA_ALLOC_CONF": "stack=simulated,nonsense_key=3"})
        self.assertIsNotNone(out)
        self.assertIn("nonsense_key", out)

    def test_allocations_show_in_stats_summary_and_snapshot(self):
        out = self.run_scenario(
            "strata_torch.validate('stack=simulated')\n"
            "sizes = [1 << 20, 3 << 20, 512, 64 << 20]\n"
            "ptrs = [lib.malloc(s, 0, None) for s in sizes]\n"
            "s1 = strata_torch.memory_stats(0)\n"
            "lib.free(ptrs[3], sizes[3], 0, None)\n"
            "s2 = strata_torch.memory_stats(0)\n"
            "strata_torch.reset_peak_memory_stats(0)\n"
            "s3 = strata_torch.memory_stats(0)\n"
            "snap = strata_torch.snapshot(0)\n"
            "for p, s in zip(ptrs[:3], sizes[:3]): lib.free(p, s, 0, None)\n"
            "s4 = strata_torch.memory_stats(0)\n"
            "print(json.dumps(dict(ptrs=ptrs, s1=s1, s2=s2, s3=s3, s4=s4, in_use=lib.is_in_use(),\n"
            "     summary=strata_torch.memory_summary(0), snap_type=type(snap).__name__)))")
        self.assertTrue(all(p for p in out["ptrs"]), out["ptrs"])
        self.assertEqual(len(set(out["ptrs"])), 4)
        self.assertTrue(all(p % 256 == 0 for p in out["ptrs"]))
        total = (1 << 20) + (3 << 20) + 512 + (64 << 20)
        s1, s2, s3, s4 = out["s1"], out["s2"], out["s3"], out["s4"]
        self.assertGreaterEqual(s1["allocated_bytes.all.current"], total)
        self.assertGreaterEqual(s1["reserved_bytes.all.current"], s1["allocated_bytes.all.current"])
        self.assertEqual(s1["allocation.all.current"], 4)
        self.assertEqual(s2["allocation.all.current"], 3)
        self.assertLess(s2["allocated_bytes.all.current"], s1["allocated_bytes.all.current"])
        self.assertEqual(s2["allocated_bytes.all.peak"], s1["allocated_bytes.all.current"])
        self.assertEqual(s3["allocated_bytes.all.peak"], s3["allocated_bytes.all.current"])
        self.assertEqual(s4["allocated_bytes.all.current"], 0)
        self.assertEqual(s4["allocation.all.freed"], 4)
        self.assertEqual(list(s1), sorted(s1))
        self.assertTrue(out["in_use"])
        self.assertIn("Allocated memory", out["summary"])
        self.assertEqual(out["snap_type"], "dict")

    def test_configuration_is_fixed_once_in_use(self):
        out = self.run_scenario(
            "strata_torch.validate('stack=simulated')\n"
            "p = lib.malloc(4096, 0, None)\n"
            "try:\n    strata_torch.validate('stack=simulated,limit=0.5'); r = None\n"
            "except RuntimeError as e:\n    r = str(e)\n"
            "strata_torch.validate('stack=simulated')   # the same configuration again is fine\n"
            "try:\n    lib.configure('stack=simulated,limit=0.5'); c = None\n"
            "except strata_torch.ConfigError as e:\n    c = str(e)\n"
            "lib.free(p, 4096, 0, None)\n"
            "print(json.dumps([r, c]))")
        self.assertIsNotNone(out[0])
        self.assertIn("before the first CUDA allocation", out[0])
        self.assertIsNotNone(out[1], "the plug-in accepted a new configuration while in use")

    def test_record_refused_once_in_use(self):
        out = self.run_scenario(
            "strata_torch.validate('stack=simulated')\n"
            "p = lib.malloc(4096, 0, None)\n"
            "try:\n    strata_torch.record('/tmp/never.csv'); r = None\n"
            "except RuntimeError as e:\n    r = str(e)\n"
            "lib.free(p, 4096, 0, None)\nprint(json.dumps(r))")
        self.assertIn("record=/tmp/never.csv", out)

    def test_out_of_memory_under_a_limit_then_usable(self):
        out = self.run_scenario(
            "strata_torch.validate('stack=simulated,limit=64MiB')\n"
            "ok = lib.malloc(32 << 20, 0, None)\n"
            "try:\n    big = lib.malloc(1 << 30, 0, None); err = None\n"
            "except OSError as e:\n    big, err = None, str(e)\n"
            "after = lib.malloc(16 << 20, 0, None)\n"
            "st = strata_torch.memory_stats(0)\n"
            "print(json.dumps(dict(ok=ok, big=big, err=err, after=after, ooms=st.get('num_ooms'))))")
        self.assertTrue(out["ok"])
        self.assertFalse(out["big"], "1 GiB under a 64 MiB limit succeeded")
        self.assertTrue(out["after"], "no allocation possible after an out-of-memory")
        self.assertGreaterEqual(out["ooms"], 1)

    def test_pytorch_allocator_settings_cap_warn_or_refuse(self):
        out = self.run_scenario(
            "strata_torch.validate('stack=simulated,sim_capacity=1GiB')\n"
            "notes = lib.apply_torch_conf('per_process_memory_fraction:0.25,max_split_size_mb:64')\n"
            "ok = lib.malloc(200 << 20, 0, None)\n"
            "too_much = lib.malloc(100 << 20, 0, None)\n"
            "try:\n    lib.apply_torch_conf('garbage_collection_threshold:0.5'); refused = None\n"
            "except strata_torch.ConfigError as e:\n    refused = str(e)\n"
            "print(json.dumps(dict(notes=notes, ok=bool(ok), too_much=bool(too_much), refused=refused)))")
        self.assertEqual(len(out["notes"]), 1)
        self.assertIn("max_split_size_mb:64 has no effect under strata", out["notes"][0])
        self.assertTrue(out["ok"])
        self.assertFalse(out["too_much"], "300 MiB served under a 256 MiB per_process_memory_fraction")
        self.assertIn("garbage_collection_threshold:0.5", out["refused"] or "")

    def test_record_then_flush_writes_the_trace(self):
        out = self.run_scenario(
            "import os, tempfile\n"
            "path = os.path.join(tempfile.mkdtemp(), 'trace.csv')\n"
            "strata_torch.record(path, conf='stack=simulated')\n"
            "ps = [lib.malloc(s, 0, None) for s in (4096, 1 << 20, 12345)]\n"
            "for p, s in zip(ps, (4096, 1 << 20, 12345)): lib.free(p, s, 0, None)\n"
            "strata_torch.flush_record()\n"
            "text = open(path).read()\n"
            "print(json.dumps(dict(size=len(text), lines=len(text.splitlines()), stack=strata_torch.memory_stats(0)['strata.stack'])))")
        self.assertEqual(out["stack"], "simulated")
        self.assertGreaterEqual(out["lines"], 6, "3 allocations and 3 frees were not all recorded")

    def test_cupy_entry_points_the_wrapper_relies_on(self):
        # strata_torch.cupy hands these to CuPy's CFunctionAllocator: null (never an exception) on failure, and
        # a free that finds the size itself (CuPy's free passes none).
        out = self.run_scenario(
            "import ctypes\n"
            "strata_torch.validate('stack=simulated,limit=64MiB')\n"
            "cm, cf = lib._functions['strata_cupy_malloc'], lib._functions['strata_cupy_free']\n"
            "a = cm(None, 8 << 20, 0); b = cm(None, 1 << 30, 0)\n"
            "mid = strata_torch.memory_stats(0)['allocated_bytes.all.current']\n"
            "cf(None, a, 0)\n"
            "end = strata_torch.memory_stats(0)['allocated_bytes.all.current']\n"
            "print(json.dumps(dict(a=a, b=b, mid=mid, end=end)))")
        self.assertTrue(out["a"])
        self.assertFalse(out["b"], "1 GiB under a 64 MiB limit was served")
        self.assertGreaterEqual(out["mid"], 8 << 20)
        self.assertEqual(out["end"], 0)


if __name__ == "__main__":
    unittest.main()
