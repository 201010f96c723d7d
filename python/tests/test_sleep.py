"""Sleep and wake by tag from Python: tag names, and the calls against the built plug-in over stack=simulated
(pretend memory: no GPU, no torch). Each scenario runs in a fresh interpreter."""

import unittest

import support

import strata_torch
from strata_torch import sleep

PRELUDE = ("import json, strata_torch\nfrom strata_torch import _library\nlib = _library.load()\n"
           "lib.configure('stack=simulated,sim_capacity=256MiB')\n"
           "MiB = 1 << 20\n")


class TagNames(unittest.TestCase):
    def test_names_get_ids_once_and_ints_are_ids(self):
        a = sleep.tag_id("trainer-test-a")
        self.assertEqual(sleep.tag_id("trainer-test-a"), a)
        self.assertNotEqual(sleep.tag_id("engine-test-b"), a)
        self.assertEqual(sleep.tag_id("default"), 0)
        self.assertEqual(sleep.tag_id(7), 7)
        self.assertGreater(a, 0)

    def test_bad_tags_are_refused(self):
        for bad in (-1, 1024, 2.5, None, True):
            with self.assertRaises((TypeError, ValueError)):
                sleep.tag_id(bad)

    def test_exported(self):
        for name in ("tag", "pause", "resume", "reserve_backup", "release_backup", "current_tag", "tag_stats"):
            self.assertIn(name, strata_torch.__all__)


class SleepOnThePlugin(unittest.TestCase):
    def setUp(self):
        self.path = support.find_library()
        if self.path is None:
            support.skip_or_fail(self, "libstrata_alloc.so is not built (CMake target strata_alloc)")
        self.env = {"STRATA_ALLOC_LIBRARY": self.path}

    def run_scenario(self, body):
        rc, out, err = support.run_python(PRELUDE + body, self.env)
        self.assertEqual(rc, 0, f"scenario failed:\n{err}")
        self.assertIsNotNone(out, f"scenario printed no JSON:\n{err}")
        return out

    def test_pause_gives_memory_back_and_resume_takes_it_again(self):
        out = self.run_scenario(
            "with strata_torch.tag('trainer') as t:\n"
            "    inside = strata_torch.current_tag()\n"
            "    p = lib.malloc(40 * MiB)\n"
            "outside = strata_torch.current_tag()\n"
            "before = lib.memory_stats(0)['reserved_bytes.all.current']\n"
            "strata_torch.reserve_backup(40 * MiB)\n"
            "strata_torch.pause('trainer')\n"
            "paused = lib.memory_stats(0)['reserved_bytes.all.current']\n"
            "try:\n    strata_torch.pause('trainer'); twice = None\n"
            "except RuntimeError as e:\n    twice = str(e)\n"
            "strata_torch.resume(['trainer'])\n"
            "after = lib.memory_stats(0)['reserved_bytes.all.current']\n"
            "unpinned = strata_torch.release_backup()\n"
            "lib.free(p, 40 * MiB)\n"
            "print(json.dumps([t, inside, outside, before, paused, twice, after, unpinned]))")
        t, inside, outside, before, paused, twice, after, unpinned = out
        self.assertEqual(inside, t)
        self.assertEqual(outside, 0)
        self.assertLessEqual(paused, before - 40 * (1 << 20))
        self.assertIn("already paused", twice)
        self.assertGreaterEqual(after, 40 * (1 << 20))
        self.assertEqual(unpinned, 40 * (1 << 20))

    def test_tag_stats_follow_pause_and_resume(self):
        out = self.run_scenario(
            "with strata_torch.tag('stats-tag'):\n    p = lib.malloc(40 * MiB)\n"
            "running = strata_torch.tag_stats('stats-tag')\n"
            "strata_torch.pause('stats-tag')\n"
            "asleep = strata_torch.tag_stats('stats-tag')\n"
            "strata_torch.resume('stats-tag')\n"
            "awake = strata_torch.tag_stats('stats-tag')\n"
            "lib.free(p, 40 * MiB)\n"
            "try:\n    strata_torch.tag_stats(5, device=-1); bad = None\n"
            "except ValueError as e:\n    bad = str(e)\n"
            "print(json.dumps([running, asleep, awake, strata_torch.tag_stats('never-used'), bad]))")
        running, asleep, awake, never, bad = out
        mib40 = 40 * (1 << 20)
        self.assertEqual((running["in_use"], running["paused"], running["paused_bytes"]), (mib40, False, 0))
        self.assertGreaterEqual(running["physical"], mib40)
        self.assertEqual((asleep["physical"], asleep["in_use"], asleep["paused"], asleep["paused_bytes"]), (0, 0, True, mib40))
        self.assertEqual((awake["in_use"], awake["paused"]), (mib40, False))
        self.assertEqual((never["physical"], never["in_use"], never["paused"]), (0, 0, False))
        self.assertIn("out of range", bad)

    def test_resume_without_room_is_a_memory_error_and_can_be_retried(self):
        out = self.run_scenario(
            "with strata_torch.tag(1):\n    p = lib.malloc(40 * MiB)\n"
            "strata_torch.pause(1)\n"
            "with strata_torch.tag(2):\n    hog = lib.malloc(220 * MiB)\n"
            "try:\n    strata_torch.resume(1); refused = None\n"
            "except MemoryError as e:\n    refused = str(e)\n"
            "lib.free(hog, 220 * MiB)\n"
            "strata_torch.resume(1)\n"
            "lib.free(p, 40 * MiB)\n"
            "print(json.dumps([refused]))")
        self.assertIsNotNone(out[0])
        self.assertIn("tag 1", out[0])


if __name__ == "__main__":
    unittest.main()
