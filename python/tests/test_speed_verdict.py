"""tests/device/torch/speed_verdict.py, the summary behind the plug-in's speed verdict: pure Python, hand-made runs."""

import importlib.util
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "speed_verdict", os.path.join(HERE, "..", "..", "tests", "device", "torch", "speed_verdict.py"))
speed_verdict = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(speed_verdict)


def run(model, alloc, rnd, windows):
    return {"model": model, "alloc": alloc, "round": rnd, "steps_per_s": windows}


class Rate(unittest.TestCase):
    def test_harmonic_over_windows(self):
        # 8 steps at 4/s and 8 at 8/s: 16 steps in 3 s
        self.assertAlmostEqual(speed_verdict.rate([4.0, 8.0]), 16 / 3)


class Summarize(unittest.TestCase):
    def test_ratios_are_paired_within_rounds(self):
        s = speed_verdict.summarize([
            run("m", "native", 0, [10.0]), run("m", "strata", 0, [9.9]),
            run("m", "strata", 1, [5.0]), run("m", "native", 1, [5.0]),   # a slow round: both slow
            run("m", "native", 2, [10.0]), run("m", "strata", 2, [9.0]),
        ])["m"]
        self.assertEqual(s["rounds"], 3)
        self.assertAlmostEqual(s["median_ratio"], 0.99)
        self.assertAlmostEqual(s["min_ratio"], 0.9)
        self.assertEqual(s["rounds_at_threshold"], 2)
        self.assertTrue(s["pass"])
        self.assertAlmostEqual(s["native_spread"], 2.0)

    def test_a_miss_fails(self):
        s = speed_verdict.summarize([run("m", "native", r, [10.0]) for r in range(3)] +
                                    [run("m", "strata", r, [9.7]) for r in range(3)])["m"]
        self.assertFalse(s["pass"])
        self.assertTrue(any(line.startswith("FAIL") for line in speed_verdict.lines({"m": s})))

    def test_failed_and_missing_runs_are_counted_not_paired(self):
        s = speed_verdict.summarize([
            run("m", "native", 0, [10.0]), {"model": "m", "alloc": "strata", "round": 0, "failed": True},
            run("m", "native", 1, [10.0]), run("m", "strata", 1, [10.0]),
            {"model": "m", "round": 2, "not_run": True},
        ])["m"]
        self.assertEqual((s["rounds"], s["failed"], s["not_run"]), (1, 1, 1))

    def test_exit_codes(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "runs.jsonl")
            with open(path, "w") as f:
                f.write('{"model": "m", "alloc": "native", "round": 0, "failed": true}\n')
            self.assertEqual(speed_verdict.main([path]), 2)
            with open(path, "w") as f:
                f.write('{"model": "m", "alloc": "native", "round": 0, "steps_per_s": [10]}\n'
                        '{"model": "m", "alloc": "strata", "round": 0, "steps_per_s": [10]}\n')
            md = os.path.join(d, "v.md")
            self.assertEqual(speed_verdict.main([path, "--markdown", md]), 0)
            self.assertIn("| m | 1 | 1.000 |", open(md).read())


if __name__ == "__main__":
    unittest.main()
