"""tests/device/pytorch_suite/: the verdict over PyTorch's own tests (compare.py) on hand-made junit XML and
records, and the pytest plug-in's parts and budget where pytest is installed. No torch, no GPU."""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "..", "..", "tests", "device", "pytorch_suite")
sys.path.insert(0, SUITE)  # as pytest has it when run.sh loads the plug-in: its modules import one another


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SUITE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compare = _load("compare")
missing_names = _load("missing_names")
try:
    import pytest  # noqa: F401
    HAVE_PYTEST = True
except ImportError:
    HAVE_PYTEST = False


def case(classname, name, body=""):
    return f'<testcase classname="{classname}" name="{name}" time="0.1">{body}</testcase>'


def junit(*cases, root="testsuites"):
    inner = "".join(cases)
    suite = f'<testsuite name="pytest" tests="{len(cases)}">{inner}</testsuite>'
    return f'<?xml version="1.0" encoding="utf-8"?>' + (f"<testsuites>{suite}</testsuites>" if root == "testsuites"
                                                          else suite)


FAIL = '<failure message="AssertionError: 1 != 2">trace</failure>'
ERROR = '<error message="failed on setup with RuntimeError">trace</error>'
SKIP = '<skipped type="pytest.skip" message="needs two GPUs">x</skipped>'
XFAIL = '<skipped type="pytest.xfail" message="expected">x</skipped>'


class Files(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def run_main(self, *argv):
        out = os.path.join(self.dir.name, "report.txt")
        with open(os.devnull, "w") as devnull:
            stdout, sys.stdout = sys.stdout, devnull
            try:
                rc = compare.main(list(argv) + ["--report", out])
            finally:
                sys.stdout = stdout
        text = open(out, encoding="utf-8").read() if os.path.exists(out) else ""
        return rc, text


class Names(unittest.TestCase):
    def test_the_directory_a_run_started_from_does_not_change_a_name(self):
        self.assertEqual(compare.name_from_junit("test.test_cuda.TestCuda", "test_x"), "test_cuda::TestCuda::test_x")
        self.assertEqual(compare.name_from_junit("test_cuda.TestCuda", "test_x"), "test_cuda::TestCuda::test_x")
        self.assertEqual(compare.name_from_junit("test.inductor.test_cudagraph_trees.CudaGraphTreeTests", "test_a"),
                         "test_cudagraph_trees::CudaGraphTreeTests::test_a")
        self.assertEqual(compare.name_from_nodeid("test/inductor/test_cudagraph_trees.py::CudaGraphTreeTests::test_a"),
                         "test_cudagraph_trees::CudaGraphTreeTests::test_a")
        self.assertEqual(compare.name_from_nodeid("test/test_cuda.py::test_free"), "test_cuda::test_free")


class Reading(Files):
    def test_every_outcome_of_a_junit_file(self):
        path = self.write("a.xml", junit(case("test.test_cuda.TestCuda", "test_p"),
                                         case("test.test_cuda.TestCuda", "test_f", FAIL),
                                         case("test.test_cuda.TestCuda", "test_e", ERROR),
                                         case("test.test_cuda.TestCuda", "test_s", SKIP),
                                         case("test.test_cuda.TestCuda", "test_x", XFAIL)))
        got = {name.rsplit("::", 1)[1]: outcome for name, (outcome, _) in compare.read_junit(path).items()}
        self.assertEqual(got, {"test_p": "passed", "test_f": "failed", "test_e": "error", "test_s": "skipped",
                               "test_x": "xfailed"})

    def test_a_testsuite_root_reads_as_a_testsuites_root(self):
        path = self.write("a.xml", junit(case("test_cuda.TestCuda", "test_f", FAIL), root="testsuite"))
        self.assertEqual(compare.read_junit(path), {"test_cuda::TestCuda::test_f": ("failed", "AssertionError: 1 != 2")})

    def test_a_failure_and_a_teardown_error_read_as_the_error(self):
        path = self.write("a.xml", junit(case("test_cuda.TestCuda", "test_t", FAIL + ERROR)))
        self.assertEqual(compare.read_junit(path)["test_cuda::TestCuda::test_t"][0], "error")

    def test_the_worst_result_of_a_test_run_twice_stands(self):
        a = self.write("a.xml", junit(case("test_cuda.TestCuda", "test_t")))
        b = self.write("b.xml", junit(case("test_cuda.TestCuda", "test_t", SKIP)))
        self.assertEqual(compare.read_results([a, b])["test_cuda::TestCuda::test_t"][0], "skipped")
        self.assertEqual(compare.read_results([b, a])["test_cuda::TestCuda::test_t"][0], "skipped")

    def test_a_record_counts_finished_tests_only(self):
        lines = [{"nodeid": "test/test_cuda.py::TestCuda::test_a", "started": 0.1},
                 {"nodeid": "test/test_cuda.py::TestCuda::test_a", "outcome": "passed", "message": ""},
                 {"nodeid": "test/test_cuda.py::TestCuda::test_hung", "started": 3.0},
                 {"nodeid": "test/test_cuda.py::TestCuda::test_late", "not_run": "budget"}]
        path = self.write("a.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
        self.assertEqual(compare.read_jsonl(path), {"test_cuda::TestCuda::test_a": ("passed", "")})

    def test_unreadable_input_is_an_input_error(self):
        with self.assertRaises(compare.InputError):
            compare.read_junit(self.write("a.xml", "<testsuites><testcase"))
        with self.assertRaises(compare.InputError):
            compare.read_junit(self.write("b.xml", "<html></html>"))
        with self.assertRaises(compare.InputError):
            compare.read_jsonl(self.write("c.jsonl", '{"nodeid": "a.py::T::t", "outcome": "exploded"}\n'))
        with self.assertRaises(compare.InputError):
            compare.read_junit(os.path.join(self.dir.name, "missing.xml"))


class Exceptions(Files):
    def test_each_line_names_a_test_and_its_reason(self):
        path = self.write("e.txt", "# why these\n\ntest_cuda::TestCuda::test_a   asserts cudaMalloc's sizes\n"
                                   "test_cuda::TestCuda::test_b*\tits reason, with # inside\n")
        found = compare.read_exceptions(path)
        self.assertEqual([(e.pattern, e.reason) for e in found],
                         [("test_cuda::TestCuda::test_a", "asserts cudaMalloc's sizes"),
                          ("test_cuda::TestCuda::test_b*", "its reason, with # inside")])

    def test_a_line_without_a_reason_is_refused_naming_it(self):
        path = self.write("e.txt", "test_cuda::TestCuda::test_a asserts sizes\ntest_cuda::TestCuda::test_b\n")
        with self.assertRaisesRegex(compare.InputError, r"e\.txt:2: 'test_cuda::TestCuda::test_b' has no reason"):
            compare.read_exceptions(path)

    def test_a_pattern_excusing_everything_is_refused(self):
        with self.assertRaisesRegex(compare.InputError, "every test"):
            compare.read_exceptions(self.write("e.txt", "** too broad\n"))

    def test_only_the_star_is_a_wildcard(self):
        e = compare.Excuse("test_cuda::TestCuda::test_graph[a]*", "why", "here")
        self.assertTrue(e.matches("test_cuda::TestCuda::test_graph[a]_cuda"))
        self.assertFalse(e.matches("test_cuda::TestCuda::test_grapha_cuda"))
        self.assertFalse(e.matches("other::test_cuda::TestCuda::test_graph[a]"))


class Verdict(Files):
    def results(self, **outcomes):
        return {f"test_cuda::TestCuda::{name}": (outcome, f"{outcome} message") for name, outcome in outcomes.items()}

    def test_every_way_a_native_pass_can_be_lost_is_a_regression(self):
        native = self.results(test_f="passed", test_e="passed", test_s="passed", test_x="passed", test_gone="passed",
                              test_ok="passed")
        strata = self.results(test_f="failed", test_e="error", test_s="skipped", test_x="xfailed", test_ok="passed")
        v = compare.compare(native, strata, [])
        self.assertFalse(v["ok"])
        self.assertEqual(v["kept"], 1)
        self.assertEqual({name.rsplit("::", 1)[1]: outcome for name, outcome, _ in v["regressions"]},
                         {"test_f": "failed", "test_e": "error", "test_s": "skipped", "test_x": "xfailed",
                          "test_gone": "not run"})

    def test_tests_that_did_not_pass_natively_are_not_demanded(self):
        native = self.results(test_f="failed", test_s="skipped", test_e="error", test_p="passed")
        strata = self.results(test_f="failed", test_s="failed", test_e="error", test_p="passed")
        v = compare.compare(native, strata, [])
        self.assertTrue(v["ok"])
        self.assertEqual(v["demanded"], ["test_cuda::TestCuda::test_p"])

    def test_listed_exceptions_excuse_exactly_their_tests(self):
        native = self.results(test_a="passed", test_b="passed", test_c="passed", test_d="passed")
        strata = self.results(test_a="failed", test_b="failed", test_c="passed", test_d="passed")
        excuses = [compare.Excuse("test_cuda::TestCuda::test_a", "reason a", "f:1"),
                   compare.Excuse("test_cuda::TestCuda::test_c", "reason c", "f:2"),
                   compare.Excuse("test_cuda::TestCuda::test_zzz", "reason z", "f:3")]
        v = compare.compare(native, strata, excuses)
        self.assertFalse(v["ok"])
        self.assertEqual([n for n, _, _ in v["regressions"]], ["test_cuda::TestCuda::test_b"])
        self.assertEqual(v["excused"], [("test_cuda::TestCuda::test_a", "failed", "reason a")])
        self.assertEqual(v["needless_exceptions"], ["test_cuda::TestCuda::test_c"])
        self.assertEqual(v["unmatched_exceptions"], ["test_cuda::TestCuda::test_zzz"])
        v = compare.compare(native, strata, excuses + [compare.Excuse("test_cuda::TestCuda::test_b", "b", "f:4")])
        self.assertTrue(v["ok"])
        self.assertEqual(len(v["excused"]), 2)

    def test_a_run_where_nothing_passed_natively_proves_nothing(self):
        v = compare.compare(self.results(test_a="failed"), self.results(test_a="passed"), [])
        self.assertFalse(v["ok"])
        self.assertIn("judged nothing", compare.report({}, {}, compare.compare({}, {}, [])))

    def test_exit_status_and_report_from_the_command_line(self):
        native = self.write("n.xml", junit(case("test.test_cuda.TestCuda", "test_a"),
                                           case("test.test_cuda.TestCuda", "test_b")))
        strata_bad = self.write("s1.xml", junit(case("test_cuda.TestCuda", "test_a"),
                                                case("test_cuda.TestCuda", "test_b", FAIL)))
        strata_good = self.write("s2.xml", junit(case("test_cuda.TestCuda", "test_a"), case("test_cuda.TestCuda", "test_b")))
        rc, text = self.run_main("--native", native, "--strata", strata_bad)
        self.assertEqual(rc, 1)
        self.assertIn("failed   test_cuda::TestCuda::test_b", text)
        self.assertIn("AssertionError: 1 != 2", text)
        self.assertIn("FAIL: 1 of 2", text)
        rc, text = self.run_main("--native", native, "--strata", strata_good)
        self.assertEqual(rc, 0)
        self.assertIn("PASS: all 2 tests", text)
        excuses = self.write("e.txt", "test_cuda::TestCuda::test_b asserts a segment size\n")
        rc, text = self.run_main("--native", native, "--strata", strata_bad, "--exceptions", excuses)
        self.assertEqual(rc, 0)
        self.assertIn("asserts a segment size", text)
        rc, _ = self.run_main("--native", native, "--strata", os.path.join(self.dir.name, "absent.xml"))
        self.assertEqual(rc, 2)

    def test_the_table_for_the_docs_escapes_the_column_separator(self):
        text = compare.table([compare.Excuse("test_cuda::T::test_a", "sizes | counts", "f:1")])
        self.assertEqual(text.splitlines()[2], "| `test_cuda::T::test_a` | sizes \\| counts |")

    def test_the_known_exceptions_file_reads(self):
        for e in compare.read_exceptions(os.path.join(SUITE, "known_exceptions.txt")):
            self.assertTrue(e.reason)


class MissingNames(unittest.TestCase):
    """Names a judged test file imports that the installed PyTorch dropped (Note [Test files from another
    PyTorch]), over stand-in modules."""

    def setUp(self):
        import types
        self.module = types.ModuleType("stand_in_helpers")
        self.module.KEPT = "installed"
        sys.modules["stand_in_helpers"] = self.module
        self.addCleanup(sys.modules.pop, "stand_in_helpers", None)

    def test_a_missing_name_is_set_and_one_present_is_left_alone(self):
        names = (("stand_in_helpers", "DROPPED", lambda: 42), ("stand_in_helpers", "KEPT", lambda: "replaced"))
        self.assertEqual(missing_names.provide_missing_names(names), ["stand_in_helpers.DROPPED"])
        self.assertEqual(self.module.DROPPED, 42)
        self.assertEqual(self.module.KEPT, "installed")
        self.assertEqual(missing_names.provide_missing_names(names), [])  # set once, then present

    def test_a_module_that_cannot_be_imported_is_skipped(self):
        names = (("no_such_module_of_pytorch", "X", lambda: 1), ("stand_in_helpers", "Y", lambda: 2))
        self.assertEqual(missing_names.provide_missing_names(names), ["stand_in_helpers.Y"])

    def test_the_listed_names_are_torch_testing_modules(self):
        for module, name, value in missing_names.MISSING_NAMES:
            self.assertTrue(module.startswith("torch.testing._internal."), module)
            self.assertTrue(name.isupper() and callable(value), name)


@unittest.skipUnless(HAVE_PYTEST, "pytest is not installed here: the plug-in runs only inside pytest")
class Plugin(Files):
    TESTS = ("import time, unittest\n"
             "class TestCuda(unittest.TestCase):\n"
             + "".join(f"    def test_{i:02d}(self): pass\n" for i in range(10))
             + "    def test_slow(self): time.sleep(1.5)\n"
             "    def test_zz_fails(self): self.fail('no')\n")

    def pytest(self, *args):
        os.makedirs(os.path.join(self.dir.name, "test"), exist_ok=True)
        with open(os.path.join(self.dir.name, "test", "test_cuda.py"), "w") as f:
            f.write(self.TESTS)
        env = dict(os.environ, PYTHONPATH=os.path.abspath(SUITE))
        return subprocess.run([sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir=.", "-p",
                               "no:cacheprovider", "-p", "suite_plugin", "-q", "test/test_cuda.py", *args],
                              cwd=self.dir.name, env=env, capture_output=True, text=True)

    def test_parts_cover_the_selection_once(self):
        plugin = _load("suite_plugin")
        for count in (1, 2, 3, 7):
            owners = [[i for i in range(1, count + 1) if plugin.in_part(p, i, count)] for p in range(20)]
            self.assertTrue(all(len(o) == 1 for o in owners), count)
        for bad in ("0/2", "3/2", "1-2", "a/b"):
            with self.assertRaises(ValueError):
                plugin.parse_split(bad)
        seen = []
        for i in (1, 2, 3):
            record = os.path.join(self.dir.name, f"part{i}.jsonl")
            self.pytest("--suite-split", f"{i}/3", "--suite-record", record)
            seen += sorted(compare.read_jsonl(record))
        self.assertEqual(len(seen), 12)
        self.assertEqual(len(set(seen)), 12)

    def test_the_record_agrees_with_the_junit_file(self):
        record, xml = os.path.join(self.dir.name, "r.jsonl"), os.path.join(self.dir.name, "r.xml")
        self.pytest("--suite-record", record, f"--junitxml={xml}")
        from_record, from_xml = compare.read_jsonl(record), compare.read_junit(xml)
        self.assertEqual(len(from_record), 12)
        self.assertEqual({k: v[0] for k, v in from_record.items()}, {k: v[0] for k, v in from_xml.items()})
        self.assertEqual(from_record["test_cuda::TestCuda::test_zz_fails"][0], "failed")

    def test_no_test_starts_after_the_budget(self):
        record = os.path.join(self.dir.name, "r.jsonl")
        run = self.pytest("--suite-budget", "1", "--suite-record", record)
        ran = compare.read_jsonl(record)
        self.assertIn("test_cuda::TestCuda::test_slow", ran)   # the slow test starts within the budget ...
        self.assertNotIn("test_cuda::TestCuda::test_zz_fails", ran)   # ... and the one after it never does
        self.assertIn("1 tests not started", run.stdout)

    def test_a_run_meant_for_strata_stops_where_strata_is_not_enabled(self):
        run = self.pytest("--suite-expect-strata")
        self.assertEqual(run.returncode, 3, run.stdout + run.stderr)
        self.assertNotIn("passed", run.stdout)


if __name__ == "__main__":
    unittest.main()
