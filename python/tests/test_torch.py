"""strata_torch with PyTorch on a GPU: each scenario in a fresh interpreter (the allocator of a process is chosen
once). Skips without torch, CUDA or the plug-in; fails instead under STRATA_REQUIRE_GPU=1."""

import unittest

import support


class WithTorch(unittest.TestCase):
    def setUp(self):
        self.path = support.find_library()
        if self.path is None:
            support.skip_or_fail(self, "libstrata_alloc.so is not built")
        rc, out, _ = support.run_python("import json, torch; print(json.dumps(torch.cuda.is_available()))")
        if rc != 0:
            support.skip_or_fail(self, "PyTorch is not installed")
        if out is not True:
            support.skip_or_fail(self, "PyTorch sees no CUDA device")
        self.env = {"STRATA_ALLOC_LIBRARY": self.path}

    def scenario(self, code):
        rc, out, err = support.run_python(code, self.env, timeout=300)
        self.assertEqual(rc, 0, err)
        self.assertIsNotNone(out, err)
        return out

    def serve(self, backend):
        return self.scenario(
            f"import json, strata_torch\nstrata_torch.enable('stack=default', backend={backend!r})\nimport torch\n"
            "x = torch.ones(1 << 20, device='cuda'); y = (x * 3).sum().item()\n"
            "s = strata_torch.memory_stats()\n"
            "seen = torch.cuda.memory_allocated() if strata_torch.backend() == 'strata' else None\n"
            "del x; torch.cuda.synchronize(); torch.cuda.empty_cache()\n"
            "after = strata_torch.memory_stats()\n"
            "print(json.dumps(dict(y=y, alloc=s['allocated_bytes.all.current'], after=after['allocated_bytes.all.current'],\n"
            "     seen=seen, hooks=strata_torch.hooks(), enabled=strata_torch.is_enabled(), backend=strata_torch.backend())))")

    def test_enable_installs_the_strata_backend(self):
        out = self.serve("strata")
        self.assertEqual(out["y"], 3.0 * (1 << 20))
        self.assertGreaterEqual(out["alloc"], 4 << 20)
        self.assertEqual(out["seen"], out["alloc"], "torch.cuda.memory_allocated() is strata's figure")
        self.assertLess(out["after"], out["alloc"])
        self.assertEqual(out["backend"], "strata")
        self.assertEqual(out["hooks"], {})

    def test_the_pluggable_path_serves_tensors_and_wires_hooks(self):
        out = self.serve("pluggable")
        self.assertEqual(out["y"], 3.0 * (1 << 20))
        self.assertGreaterEqual(out["alloc"], 4 << 20)
        self.assertLess(out["after"], out["alloc"])
        self.assertTrue(out["enabled"])
        self.assertEqual(out["backend"], "pluggable")
        for setter in ("set_reset_fn", "set_record_stream_fn", "set_begin_allocate_to_pool"):
            self.assertIn(setter, out["hooks"])

    def test_enable_after_cuda_started_is_a_clear_error(self):
        out = self.scenario(
            "import json, torch, strata_torch\nx = torch.zeros(4, device='cuda')\n"
            "try:\n    strata_torch.enable('stack=default'); print(json.dumps(None))\n"
            "except RuntimeError as e:\n    print(json.dumps(str(e)))")
        self.assertIsNotNone(out, "enable() after CUDA started was accepted")
        self.assertIn("before the first CUDA allocation", out)

    def test_bad_conf_is_a_value_error_before_anything_changes(self):
        out = self.scenario(
            "import json, strata_torch\n"
            "try:\n    strata_torch.enable('stack=nope'); r = None\n"
            "except ValueError as e:\n    r = str(e)\n"
            "import torch\nx = torch.ones(8, device='cuda')   # still PyTorch's own allocator\n"
            "print(json.dumps([r, strata_torch.is_enabled(), torch.cuda.memory_allocated() > 0]))")
        self.assertIn("nope", out[0])
        self.assertEqual(out[1:], [False, True])

    def test_mempool_scopes_strata(self):
        out = self.scenario(
            "import json, torch, strata_torch\nw = torch.ones(16, device='cuda')\n"
            "pool = strata_torch.MemPool('stack=default')\n"
            "with torch.cuda.use_mem_pool(pool):\n    t = torch.ones(1 << 22, device='cuda')\n"
            "inside = strata_torch.memory_stats()['allocated_bytes.all.current']\n"
            "print(json.dumps([inside, float(t.sum())]))")
        self.assertGreaterEqual(out[0], 16 << 20)
        self.assertEqual(out[1], float(1 << 22))


if __name__ == "__main__":
    unittest.main()
