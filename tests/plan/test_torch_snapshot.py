"""tools/plan/torch_snapshot.py: a PyTorch memory snapshot, built by hand in PyTorch's layout, converted to
strata's trace format and replayed by strata-plan to the peak live the snapshot's own events give.

Run: python3 -m unittest test_torch_snapshot (in tests/plan). STRATA_PLAN names the strata-plan program;
without it the replay tests are skipped (ctest always sets it).
"""
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CONVERTER = os.path.join(HERE, "..", "..", "tools", "plan", "torch_snapshot.py")
sys.path.insert(0, os.path.dirname(CONVERTER))
import torch_snapshot  # noqa: E402

MiB = 1 << 20
SIDE_STREAM = 94305712  # PyTorch records a stream as its cudaStream_t value: a large number


def event(action, addr, size, stream=0, time_us=0):
    """One entry of device_traces, with the keys PyTorch writes (frames empty: no stack recorded)."""
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time_us, "frames": []}


def make_snapshot():
    """Two segments and a side stream; blocks freed with free_requested then free_completed, as PyTorch does
    when a block waits for another stream. Returns (snapshot, peak live, live at the end)."""
    small, large, side = 0x7F0000000000, 0x7F0000200000, 0x7F0001600000
    trace = [
        event("segment_alloc", small, 2 * MiB),
        event("alloc", small, 512),
        event("alloc", small + 512, 4096),
        event("segment_alloc", large, 20 * MiB),
        event("alloc", large, 6 * MiB),
        event("segment_alloc", side, 20 * MiB, SIDE_STREAM),  # PyTorch's pools are per stream
        event("alloc", side, 8 * MiB, SIDE_STREAM),
        event("free_requested", small, 512),
        event("free_completed", small, 512),
        event("alloc", small, 1024),                       # live: 1024 + 4096 + 6 MiB + 8 MiB: the peak
        event("free_requested", large, 6 * MiB),
        event("free_completed", large, 6 * MiB),
        event("alloc", large, 2 * MiB),
        event("free_completed", side, 8 * MiB, SIDE_STREAM),
        event("snapshot", 0, 0),
    ]
    peak = 1024 + 4096 + 6 * MiB + 8 * MiB
    end = 1024 + 4096 + 2 * MiB
    segments = [
        {"device": 0, "address": small, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
         "allocated_size": 1024 + 4096, "active_size": 1024 + 4096, "requested_size": 1000 + 4000,
         "blocks": [{"address": small, "size": 1024, "requested_size": 1000, "state": "active_allocated", "frames": []},
                    {"address": small + 1024, "size": 4096, "requested_size": 4000, "state": "active_allocated", "frames": []}]},
        {"device": 0, "address": large, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
         "allocated_size": 2 * MiB, "active_size": 2 * MiB, "requested_size": 2 * MiB,
         "blocks": [{"address": large, "size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated", "frames": []},
                    {"address": large + 2 * MiB, "size": 18 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]},
        {"device": 0, "address": side, "total_size": 20 * MiB, "stream": SIDE_STREAM, "segment_type": "large",
         "allocated_size": 0, "active_size": 0, "requested_size": 0,
         "blocks": [{"address": side, "size": 20 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]},
    ]
    snapshot = {"segments": segments, "device_traces": [trace, []],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1}}
    return snapshot, peak, end


class Convert(unittest.TestCase):
    def test_events_become_a_trace_with_streams_renumbered(self):
        snapshot, peak, end = make_snapshot()
        rows, summary = torch_snapshot.convert(snapshot)
        self.assertEqual(rows, [("a", 0, 512, 0), ("a", 1, 4096, 0), ("a", 2, 6 * MiB, 0), ("a", 3, 8 * MiB, 1),
                                ("f", 0, 512, 0), ("a", 4, 1024, 0), ("f", 2, 6 * MiB, 0), ("a", 5, 2 * MiB, 0),
                                ("f", 3, 8 * MiB, 1)])
        self.assertEqual(summary["peak_live"], peak)
        self.assertEqual(summary["live_at_end"], end)
        # The snapshot's own segments agree with what the trace leaves live.
        self.assertEqual(summary["allocated_at_dump"], end)
        self.assertEqual(summary["streams"], 2)
        self.assertEqual(summary["dropped_frees"], 0)

    def test_frees_of_blocks_allocated_before_recording_are_dropped_and_counted(self):
        snapshot, _, _ = make_snapshot()
        snapshot["device_traces"][0].insert(0, event("free_completed", 0x7E0000000000, 4096))
        rows, summary = torch_snapshot.convert(snapshot)
        self.assertEqual(summary["dropped_frees"], 1)
        self.assertEqual(len(rows), 9)

    def test_the_busiest_device_is_chosen_unless_one_is_named(self):
        snapshot, _, _ = make_snapshot()
        snapshot["device_traces"].reverse()
        _, summary = torch_snapshot.convert(snapshot)
        self.assertEqual(summary["device"], 1)
        _, summary = torch_snapshot.convert(snapshot, device=1)
        self.assertEqual(summary["device"], 1)
        with self.assertRaisesRegex(torch_snapshot.SnapshotError, "--device 5: the snapshot has traces for devices 0..1"):
            torch_snapshot.convert(snapshot, device=5)
        with self.assertRaisesRegex(torch_snapshot.SnapshotError, "no allocation on any device"):
            torch_snapshot.convert({"device_traces": [[]]})


class BadInput(unittest.TestCase):
    def run_converter(self, data, *args):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snap.pickle")
            with open(path, "wb") as f:
                f.write(data)
            out = subprocess.run([sys.executable, CONVERTER, path, "-o", os.path.join(tmp, "t.csv"), *args],
                                 capture_output=True, text=True)
            return out.returncode, out.stderr.replace(path, "SNAP")

    def bad_event(self, index, entry):
        snapshot, _, _ = make_snapshot()
        snapshot["device_traces"][0][index] = entry
        return self.run_converter(pickle.dumps(snapshot))

    def test_truncated_pickle(self):
        snapshot, _, _ = make_snapshot()
        code, err = self.run_converter(pickle.dumps(snapshot)[:200])
        self.assertEqual(code, 2)
        self.assertIn("torch_snapshot: SNAP: not a readable pickle (truncated or corrupt?)", err)

    def test_unknown_action(self):
        code, err = self.bad_event(4, event("realloc", 1, 512))
        self.assertEqual(code, 2)
        self.assertIn("SNAP: device 0, event 4: unknown action 'realloc' (known: alloc, free_completed,", err)

    def test_negative_size(self):
        code, err = self.bad_event(4, event("alloc", 0x1000, -512))
        self.assertEqual((code, err.strip()), (2, "torch_snapshot: SNAP: device 0, event 4: negative size -512"))

    def test_size_that_is_not_a_number(self):
        code, err = self.bad_event(4, event("alloc", 0x1000, "512"))
        self.assertEqual((code, err.strip()), (2, "torch_snapshot: SNAP: device 0, event 4: size '512' is not an integer"))

    def test_alloc_at_a_live_address(self):
        code, err = self.bad_event(2, event("alloc", 0x7F0000000000, 512))
        self.assertEqual(code, 2)
        self.assertIn("SNAP: device 0, event 2: alloc at 0x7f0000000000, still live since event 1", err)

    def test_not_a_snapshot(self):
        code, err = self.run_converter(pickle.dumps({"segments": []}))
        self.assertEqual(code, 2)
        self.assertIn("SNAP: no device_traces", err)

    def test_a_pickle_that_names_a_class_is_not_loaded(self):
        import collections
        code, err = self.run_converter(pickle.dumps(collections.OrderedDict(device_traces=[])))
        self.assertEqual(code, 2)
        self.assertIn("refers to collections.OrderedDict", err)


@unittest.skipUnless(os.environ.get("STRATA_PLAN"), "STRATA_PLAN (the strata-plan program) not set")
class Replay(unittest.TestCase):
    def test_strata_plan_replays_the_snapshot_to_its_peak_live(self):
        snapshot, peak, _ = make_snapshot()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snap.pickle")
            with open(path, "wb") as f:
                pickle.dump(snapshot, f)
            report = os.path.join(tmp, "plan.json")
            out = subprocess.run([os.environ["STRATA_PLAN"], path, "--json", report, "--no-progress"],
                                 capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            with open(report) as f:
                plan = json.load(f)
        (trace,) = plan["traces"]
        self.assertEqual(trace["operations"], 9)
        self.assertEqual(len(trace["stacks"]), 14)
        for stack in trace["stacks"]:
            self.assertEqual(stack["peak_live"], peak, stack["name"])
            self.assertGreaterEqual(stack["peak_reserved"], peak, stack["name"])
        torch_like = next(s for s in trace["stacks"] if s["name"] == "pytorch_caching")
        # The model holds what PyTorch held here (its segment_alloc events): 2 MiB, and 20 MiB per stream.
        segments = sum(e["size"] for e in snapshot["device_traces"][0] if e["action"] == "segment_alloc")
        self.assertEqual(segments, 42 * MiB)
        self.assertEqual(torch_like["peak_reserved"], segments)

    def test_a_bad_snapshot_is_exit_code_2(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snap.pickle")
            with open(path, "wb") as f:
                f.write(b"\x80\x04\x95")
            out = subprocess.run([os.environ["STRATA_PLAN"], path, "--no-progress"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 2)
        self.assertIn("not a readable pickle", out.stderr)
        self.assertIn("the PyTorch snapshot converter failed", out.stderr)


if __name__ == "__main__":
    unittest.main()
