"""strata-plan's command line: the JSON report has the schema the memory map viewer renders, its figures
equal bench/replay's on the same trace, and bad input is exit code 2 with a message naming what was wrong.

Run: python3 -m unittest test_cli (in tests/plan) with STRATA_PLAN set (and STRATA_REPLAY for the
comparison with bench/replay); ctest sets both.
"""
import json
import os
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
MIXED = os.path.join(HERE, "mixed.csv.gz")
PLAN = os.environ.get("STRATA_PLAN")
REPLAY = os.environ.get("STRATA_REPLAY")

STACK_FIELDS = {"name", "description", "peak_live", "peak_reserved", "ratio", "largest_free_at_peak", "upstream_calls",
                "map_calls", "unmap_calls", "fits", "min_capacity", "timeline", "peak_map"}


def plan(*args):
    return subprocess.run([PLAN, *args, "--no-progress"], capture_output=True, text=True)


def plan_json(*args):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.json")
        out = plan(*args, "--json", path)
        if out.returncode != 0:
            raise AssertionError(out.stderr)
        with open(path) as f:
            return json.load(f), out.stdout


@unittest.skipUnless(PLAN, "STRATA_PLAN (the strata-plan program) not set")
class Report(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.report, cls.stdout = plan_json(MIXED, "--capacity", "64MiB")

    def test_schema(self):
        r = self.report
        self.assertEqual((r["tool"], r["version"]), ("strata-plan", 1))
        (trace,) = r["traces"]
        self.assertEqual(trace["trace"], MIXED)
        self.assertEqual(trace["operations"], 1500)
        self.assertEqual(trace["scale"], 1.0)
        self.assertEqual(trace["capacity"], 64 << 20)
        self.assertEqual(len(trace["stacks"]), 14)
        for s in trace["stacks"]:
            self.assertLessEqual(STACK_FIELDS, set(s), s["name"])
            self.assertAlmostEqual(s["ratio"], s["peak_reserved"] / s["peak_live"], places=4)
            t = s["timeline"]
            self.assertTrue(len(t["op"]) == len(t["live"]) == len(t["reserved"]) <= 2000)
            self.assertEqual(max(t["live"]), s["peak_live"])
            self.assertIsInstance(s["fits"], bool)
            self.assertEqual(s["fits"], s["min_capacity"] <= 64 << 20 or s["fits"])
            m = s["peak_map"]
            self.assertLessEqual({"at_op", "snapshot", "largest_request"}, set(m))
            self.assertLessEqual({"box", "segments"}, set(m["snapshot"]))
            self.assertEqual(m["largest_request"]["size"], 24 << 20)
            if m["largest_request"]["segment"] is not None:
                seg = m["snapshot"]["segments"][m["largest_request"]["segment"]]
                block = next(b for b in seg["blocks"] if b["offset"] == m["largest_request"]["offset"])
                self.assertTrue(block["free"])
                self.assertGreaterEqual(block["size"], 24 << 20)
            pages = s["name"].startswith(("default_pool", "mapped_pool"))
            self.assertEqual(s["map_calls"] is None, not pages, s["name"])

    def test_table_names_every_stack_and_the_comparison(self):
        for name in ("default_pool (recommended", "baseline: cudaMalloc per tensor", "baseline: PyTorch-like caching pool"):
            self.assertIn(name, self.stdout)
        self.assertIn("=> default_pool needs", self.stdout)

    def test_stacks_option_and_scale(self):
        r, _ = plan_json(MIXED, "--stacks", "default_pool,cudamalloc", "--scale", "2")
        (trace,) = r["traces"]
        self.assertEqual([s["name"] for s in trace["stacks"]], ["default_pool", "cudamalloc"])
        self.assertEqual(trace["scale"], 2)
        self.assertGreater(trace["stacks"][0]["peak_live"], self.report["traces"][0]["stacks"][0]["peak_live"])

    def test_a_request_no_stack_can_serve_is_reported_not_searched(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "huge.csv")
            with open(path, "w") as f:
                f.write("a,1,512,0\na,2,%d,0\n" % (1 << 50))  # 1 PiB: more than any simulated device reserves
            report, stdout = plan_json(path, "--capacity", "80GiB", "--stacks", "default_pool,coalescing_pool,cudamalloc,pytorch_caching")
        for s in report["traces"][0]["stacks"]:
            self.assertIsNotNone(s["failure"], s["name"])
            self.assertIn("1125899906842624", s["failure"])  # the request, named by the box that refused it
            self.assertEqual((s["fits"], s["min_capacity"], s["peak_map"]), (False, None, None), s["name"])
        self.assertEqual(stdout.count("FAILED after 1 operations"), 4)

    def test_no_progress_bar_when_standard_error_is_not_a_terminal(self):
        out = subprocess.run([PLAN, MIXED, "--stacks", "default_pool"], capture_output=True, text=True)
        self.assertEqual((out.returncode, out.stderr), (0, ""))

    def test_device_without_a_gpu_says_so(self):
        out = plan(MIXED, "--stacks", "cudamalloc", "--device")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue("--device: no GPU here: simulated memory only" in out.stdout or "on the GPU" in out.stdout)


@unittest.skipUnless(PLAN, "STRATA_PLAN (the strata-plan program) not set")
class BadInput(unittest.TestCase):
    def refused(self, args, message, text=None):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.csv")
            if text is not None:
                with open(path, "w") as f:
                    f.write(text)
            out = plan(*[path if a == "TRACE" else a for a in args])
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn(message, out.stderr.replace(path, "TRACE"))

    def test_capacity_that_does_not_parse(self):
        self.refused([MIXED, "--capacity", "80GX"], "strata-plan: capacity `80GX`: unknown unit `GX`")
        self.refused([MIXED, "--capacity", "H900"], "strata-plan: capacity `H900`: not a size or a known device")
        self.refused([MIXED, "--capacity", "15"], "strata-plan: capacity `15`: no unit (write 15GiB, 15GB or 15B for bytes)")

    def test_binary_input_is_not_echoed(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.csv")
            with open(path, "wb") as f:
                f.write(b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x1b[2J\x1b]0;title\x07\n")
            out = subprocess.run([PLAN, path, "--no-progress"], capture_output=True)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn(b"binary data, not a trace", out.stderr)
        self.assertFalse(any(c < 0x20 and c != 0x0A for c in out.stderr), out.stderr)

    def test_bad_traces(self):
        self.refused(["TRACE"], "strata-plan: TRACE:3: free of unknown id 9", "op,id,bytes,stream\na,1,512,0\nf,9,512,0\n")
        self.refused(["TRACE"], "strata-plan: TRACE:2: negative size -4", "a,1,512,0\na,2,-4,0\n")
        self.refused(["TRACE"], "strata-plan: TRACE:1: unknown op `r`", "r,1,512,0\n")
        self.refused(["TRACE"], "strata-plan: TRACE:1: the size `lots` is not a number of bytes", "a,1,lots,0\n")
        self.refused(["TRACE"], "strata-plan: TRACE:2: the last line has no newline: the file looks truncated", "a,1,512,0\na,2,5")
        self.refused([os.path.join(HERE, "truncated.csv.gz")], "truncated.csv.gz: truncated or corrupt gzip data")
        self.refused(["TRACE"], "strata-plan: TRACE: cannot open the file")

    def test_bad_options(self):
        self.refused([MIXED, "--stacks", "default_pool,nope"], "--stacks: unknown stack `nope` (known: default_pool,")
        self.refused([MIXED, "--scale", "-1"], "--scale `-1`: not a positive number")
        self.refused([MIXED, "--frobnicate"], "unknown option --frobnicate")
        self.refused([], "no trace given")


@unittest.skipUnless(PLAN and REPLAY, "STRATA_PLAN and STRATA_REPLAY (bench/replay) not set")
class SameAsReplay(unittest.TestCase):
    def test_every_stack_reports_bench_replays_figures(self):
        shipped = os.path.join(HERE, "..", "..", "bench", "traces", "vit_train_2streams.csv.gz")
        for trace in (MIXED, shipped):
            report, _ = plan_json(trace)
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "replay.json")
                out = subprocess.run([REPLAY, trace, "--json", path], capture_output=True, text=True)
                self.assertEqual(out.returncode, 0, out.stderr)
                with open(path) as f:
                    replay = {r["stack"]: r for r in json.load(f)["results"]}
            stacks = report["traces"][0]["stacks"]
            self.assertEqual(len(stacks), len(replay))
            for s in stacks:
                r = replay[s["description"]]
                for field in ("peak_live", "peak_reserved", "upstream_calls"):
                    self.assertEqual(s[field], r[field], (trace, s["name"], field))
                if s["map_calls"] is not None:
                    self.assertEqual((s["map_calls"], s["unmap_calls"]), (r["page_calls"]["maps"], r["page_calls"]["unmaps"]))

if __name__ == "__main__":
    unittest.main()
