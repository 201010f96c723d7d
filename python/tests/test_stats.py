"""memory_stats() shaping and memory_summary() formatting: pure Python, from hand-made statistics."""

import collections
import unittest

import support  # noqa: F401  (puts python/ on sys.path)
from strata_torch import _stats


STATS = {
    "reserved_bytes.all.current": 3 * 2**30, "reserved_bytes.all.peak": 4 * 2**30,
    "reserved_bytes.all.allocated": 5 * 2**30,
    "allocated_bytes.all.current": 2**30, "allocated_bytes.all.peak": 2 * 2**30,
    "active_bytes.all.current": 2**30, "active_bytes.all.peak": 2 * 2**30,
    "allocation.all.current": 12, "allocation.all.allocated": 1000, "allocation.all.freed": 988,
    "segment.all.current": 3, "num_ooms": 1, "num_alloc_retries": 0,
    "strata.fragmentation": 0.125, "strata.largest_free": 512 * 2**20, "strata.stack": "default",
    "strata.held_for_other_streams_bytes": 3 * 2**20, "strata.limit_bytes": 2**64 - 1,
}


class FormatBytes(unittest.TestCase):
    def test_units(self):
        self.assertEqual(_stats.format_bytes(0), "0 B")
        self.assertEqual(_stats.format_bytes(1023), "1023 B")
        self.assertEqual(_stats.format_bytes(1024), "1.00 KiB")
        self.assertEqual(_stats.format_bytes(1536), "1.50 KiB")
        self.assertEqual(_stats.format_bytes(3 * 2**30), "3.00 GiB")
        self.assertEqual(_stats.format_bytes(2**50 * 2048), "2048.00 PiB")
        self.assertEqual(_stats.format_bytes(-2048), "-2.00 KiB")

    def test_rejects_non_numbers(self):
        for bad in ("12", None, True):
            with self.assertRaises(TypeError):
                _stats.format_bytes(bad)


class Flatten(unittest.TestCase):
    def test_nested_objects_join_with_dots_and_sort(self):
        flat = _stats.flatten({"segment": {"all": {"peak": 2, "current": 1}}, "num_ooms": 0})
        self.assertIsInstance(flat, collections.OrderedDict)
        self.assertEqual(list(flat.items()),
                         [("num_ooms", 0), ("segment.all.current", 1), ("segment.all.peak", 2)])

    def test_flat_input_is_sorted_unchanged(self):
        flat = _stats.flatten(STATS)
        self.assertEqual(list(flat), sorted(STATS))
        self.assertEqual(dict(flat), STATS)

    def test_rejects_non_object(self):
        with self.assertRaises(TypeError):
            _stats.flatten([1, 2])


class Summary(unittest.TestCase):
    def test_every_figure_appears_formatted(self):
        text = _stats.summary(STATS, device=1)
        self.assertIn("device 1", text)
        self.assertIn("(stack: default)", text)
        row = next(line for line in text.splitlines() if line.startswith("| Reserved memory"))
        self.assertEqual([c.strip() for c in row.strip("|").split("|")],
                         ["Reserved memory", "3.00 GiB", "4.00 GiB", "5.00 GiB"])
        row = next(line for line in text.splitlines() if line.startswith("| Allocations"))
        self.assertEqual([c.strip() for c in row.strip("|").split("|")], ["Allocations", "12", "-", "1000"])
        self.assertIn("2.000", text)        # peak reserved / peak allocated = 4 GiB / 2 GiB
        self.assertIn("0.125", text)        # fragmentation
        self.assertIn("512.00 MiB", text)   # largest free block
        self.assertRegex(text, r"waiting for other streams +\| +3.00 MiB")
        self.assertRegex(text, r"Limit +\| +none")

    def test_a_limit_prints_in_bytes(self):
        self.assertRegex(_stats.summary(dict(STATS, **{"strata.limit_bytes": 40 * 2**30})), r"Limit +\| +40.00 GiB")

    def test_lines_have_one_width(self):
        widths = {len(line) for line in _stats.summary(STATS).splitlines()}
        self.assertEqual(len(widths), 1, widths)

    def test_missing_keys_print_a_dash(self):
        text = _stats.summary({})
        row = next(line for line in text.splitlines() if line.startswith("| Reserved memory"))
        self.assertEqual([c.strip() for c in row.strip("|").split("|")], ["Reserved memory", "-", "-", "-"])
        self.assertNotIn("stack:", text)

    def test_peak_ratio(self):
        self.assertEqual(_stats.peak_ratio(STATS), 2.0)
        self.assertIsNone(_stats.peak_ratio({"reserved_bytes.all.peak": 10}))


if __name__ == "__main__":
    unittest.main()
