#!/usr/bin/env python3
"""bench/driver_time.py's pricing and verdict on made-up replays, where every figure is known: the run is on the
device, so this is what CI can check of it. And bench/variant_prices.py's counts, which price the same way."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import driver_time  # noqa: E402
import variant_prices  # noqa: E402

TORCH = driver_time.TORCH
EXPANDABLE = driver_time.EXPANDABLE
MINE = "strata default_pool"

VMM = {"device": "pretend", "rows": [
    {"what": "cuMemCreate 2 MiB", "us": 10.0}, {"what": "cuMemCreate 8 MiB", "us": 20.0},
    {"what": "cuMemCreate 2 MiB (512 in a row)", "us": 900.0},   # left out of the creates' price
    {"what": "cuMemRelease 2 MiB", "us": 5.0}, {"what": "cuMemMap whole 2 MiB handle", "us": 1.0},
    {"what": "cuMemSetAccess whole 2 MiB handle", "us": 40.0}, {"what": "cuMemUnmap whole 2 MiB handle", "us": 20.0},
    {"what": "cudaDeviceSynchronize, idle device", "us": 0.5}, {"what": "cudaMalloc 2 MiB", "us": 50.0},
    {"what": "cudaFree 2 MiB, idle device", "us": 70.0}]}


def result(stack, ns, ratio, calls, operations=1000):
    return {"stack": stack, "operations": operations, "ns_per_op": ns, "ratio": ratio, "device_calls": calls,
            "ns_per_op_rounds": [ns - 10, ns, ns + 10], "failed": False}


def run(results):
    """driver_time.main over one trace with these results: (exit status, the markdown it wrote)."""
    with tempfile.TemporaryDirectory() as d:
        peers, vmm, md = (os.path.join(d, n) for n in ("peers.json", "vmm.json", "verdict.md"))
        with open(peers, "w") as f:
            json.dump({"device": "pretend", "torch": "PyTorch", "replay": [{"trace": "x/t.csv.gz", "results": results}]}, f)
        with open(vmm, "w") as f:
            json.dump(VMM, f)
        argv, sys.argv = sys.argv, ["driver_time.py", peers, vmm, "--markdown", md]
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                status = driver_time.main()
        finally:
            sys.argv = argv
        with open(md) as f:
            return status, f.read()


def beside_pytorch(mine):
    """run() over `mine` beside PyTorch's two rows: 600 ns/op, 1.2 held / live, 4 cudaMallocs (200 ns/op priced),
    and expandable segments at 1.04."""
    return run([mine, result(TORCH, 600, 1.2, {"device_allocs": 4, "device_frees": 0}),
                result(EXPANDABLE, 900, 1.04, {"device_allocs": 4, "device_frees": 0})])


class DriverTime(unittest.TestCase):
    def test_prices_are_the_medians_of_their_rows(self):
        p = driver_time.prices(VMM)
        self.assertEqual(p["creates"], 15.0)          # median of 10 and 20; the run of 512 left out
        self.assertEqual(p["access_calls"], 40.0)
        self.assertEqual(p["expandable_alloc"], 15.0 + 1.0 + 40.0)
        self.assertEqual(p["expandable_free"], 20.0 + 5.0)

    def test_page_calls_and_device_allocations_are_priced_per_operation(self):
        p = driver_time.prices(VMM)
        mine = result(MINE, 500, 1.02, {"creates": 10, "maps": 10, "access_calls": 10, "reserves": 2})
        self.assertAlmostEqual(driver_time.driver_ns_per_op(mine, p), (10 * 15 + 10 * 1 + 10 * 40) * 1000 / 1000)
        torch = result(TORCH, 600, 1.2, {"device_allocs": 4, "device_frees": 1})
        self.assertAlmostEqual(driver_time.driver_ns_per_op(torch, p), (4 * 50 + 70) * 1000 / 1000)
        expandable = result(EXPANDABLE, 900, 1.05, {"device_allocs": 2, "device_frees": 0})
        self.assertAlmostEqual(driver_time.driver_ns_per_op(expandable, p), 2 * 56.0)
        self.assertIsNone(driver_time.driver_ns_per_op(result(MINE, 1, 1, {}), p))

    def test_timed_calls_are_reported_beside_the_price(self):
        timed = result(MINE, 500, 1.02, {"creates": 1, "us_creates": 300, "us_access_calls": 200})
        self.assertAlmostEqual(driver_time.measured_ns_per_op(timed), 500.0)
        self.assertIsNone(driver_time.measured_ns_per_op(result(MINE, 1, 1, {"creates": 1})))

    def test_every_target_met(self):
        status, text = beside_pytorch(result(MINE, 500, 1.02, {"creates": 2, "access_calls": 2}))
        self.assertEqual(status, 0)
        self.assertIn("every target met", text)

    def test_each_miss_is_named(self):
        status, text = beside_pytorch(result(MINE, 700, 1.06, {"creates": 20, "access_calls": 20}))
        self.assertEqual(status, 3)
        self.assertIn("3 missed", text)
        self.assertIn("t: 700 ns/op against PyTorch's 600", text)
        self.assertIn("t: held / live 1.060 (expandable segments 1.040)", text)
        self.assertIn("t: driver 1,100 ns/op against PyTorch's 200", text)

    def test_held_equal_to_expandable_segments_is_a_miss(self):
        status, text = run([result(MINE, 500, 1.03, {}), result(TORCH, 600, 1.2, {"device_allocs": 1, "device_frees": 0}),
                            result(EXPANDABLE, 900, 1.03, {})])
        self.assertEqual(status, 3)
        self.assertIn("held / live 1.030", text)

    def test_pytorch_without_device_calls_is_a_miss(self):
        status, text = run([result(MINE, 500, 1.02, {"creates": 1}), result(TORCH, 600, 1.2, {}),
                            result(EXPANDABLE, 900, 1.04, {})])
        self.assertEqual(status, 3)
        self.assertIn("t: PyTorch's device calls were not counted", text)

    def test_a_stack_that_did_not_replay_is_a_miss(self):
        failed = dict(result(MINE, 0, 0, {}), failed=True)
        status, text = run([failed, result(TORCH, 600, 1.2, {})])
        self.assertEqual(status, 3)
        self.assertIn("FAILED", text)
        self.assertIn(f"t: {MINE} did not replay", text)


def variants(cells):
    """A mapped_variants --json document over traces a and b (1000 operations each); the PyTorch-like model
    makes 4 cudaMallocs on each (200 ns/op priced). cells: {variant: {trace: (held_live list, creates)}}."""
    return {"scales": [0.9, 1.0, 1.1],
            "pytorch_model": {t: {"operations": 1000, "held_live": 1.2, "device_allocs": 4, "device_frees": 0} for t in "ab"},
            "variants": [{"name": name, "traces": {t: {"operations": 1000, "held_live": held, "device_calls": {"creates": creates}}
                                                   for t, (held, creates) in traces.items()}}
                         for name, traces in cells.items()]}


class VariantPrices(unittest.TestCase):
    price = driver_time.prices(VMM)  # a create costs 15 µs: 13 creates on 1000 operations price at 195 ns/op

    def rows(self, cells):
        lines, any_met = variant_prices.table(variants(cells), self.price, 1.05)
        cells_of = (line.strip("| ").split(" | ") for line in lines[2:] if line.startswith("| "))
        return {cells[0]: cells[1:] for cells in cells_of}, any_met

    def test_a_variant_lean_and_cheap_everywhere_meets_both(self):
        rows, any_met = self.rows({"v": {"a": ([1.01, 1.02, 1.05], 13), "b": ([1.0, 1.0, 1.0], 1)}})
        self.assertTrue(any_met)
        self.assertEqual(rows["v"][:4], ["1.050", "2", "2", "2"])

    def test_one_size_over_the_limit_or_one_create_too_many_is_counted_against_the_trace(self):
        rows, any_met = self.rows({"v": {"a": ([1.01, 1.051, 1.0], 13), "b": ([1.0, 1.0, 1.0], 14)}})
        self.assertFalse(any_met)
        self.assertEqual(rows["v"][:4], ["1.051", "1", "1", "0"])

    def test_a_failed_size_is_no_figure(self):
        rows, any_met = self.rows({"v": {"a": ([1.01, 1.02], 1), "b": ([1.0, 1.0, 1.0], 1)}})
        self.assertFalse(any_met)
        self.assertEqual(rows["v"][:2], ["failed on a trace", "1"])


if __name__ == "__main__":
    unittest.main()
