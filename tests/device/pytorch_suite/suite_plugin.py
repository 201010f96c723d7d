"""pytest plug-in for running PyTorch's own tests natively and under strata (loaded with -p suite_plugin).

Options:
  --suite-split I/N      run the I-th of N parts (1-based) of the selected tests: test k (in collection order)
                         belongs to part k mod N + 1, so every part mixes the files' classes, and the native
                         and the strata run of a part select the same tests
  --suite-budget S       start no test after S seconds, so pytest still writes its junit XML inside the device's
                         time limit; the tests left out are listed in the record and reported as not run
  --suite-record FILE    JSON lines, written and flushed test by test: {"nodeid", "started"} when a test
                         begins, {"nodeid", "outcome", "message"} when it ends (compare.py reads it where a
                         killed run left no XML; a "started" line without an end names the test that hung)
  --suite-expect-strata  stop before any test unless strata_torch.enable() made strata PyTorch's allocator
                         in this process (sitecustomize.py does it); a run meant for strata never passes
                         silently on PyTorch's allocator

Before collection it gives the installed PyTorch's testing helpers the names the judged files import and
that PyTorch no longer has (missing_names.py: Note [Test files from another PyTorch]).
"""

import json
import time

import pytest

from missing_names import provide_missing_names

_OUTCOME_ORDER = {"passed": 0, "xfailed": 1, "skipped": 2, "failed": 3, "error": 4}


def parse_split(text):
    """(index, count), 1 <= index <= count, from "I/N"; ValueError naming the text otherwise."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--suite-split {text!r}: expected I/N, for example 2/3") from None
    if not 1 <= index <= count:
        raise ValueError(f"--suite-split {text!r}: I must lie in 1..N")
    return index, count


def in_part(position, index, count):
    """Whether the test at 0-based collection position belongs to part index (1-based) of count."""
    return position % count == index - 1


def pytest_addoption(parser):
    group = parser.getgroup("strata suite")
    group.addoption("--suite-split", default=None, help="I/N: run the I-th of N parts of the selected tests")
    group.addoption("--suite-budget", type=float, default=None, help="seconds after which no test is started")
    group.addoption("--suite-record", default=None, help="JSON-lines record of every test, written as it runs")
    group.addoption("--suite-expect-strata", action="store_true", help="refuse to run unless strata is enabled")


def pytest_configure(config):
    if config.getoption("--suite-split"):
        try:
            parse_split(config.getoption("--suite-split"))
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
    if config.getoption("--suite-expect-strata"):
        try:
            import strata_torch
            backend = strata_torch.backend() if strata_torch.is_enabled() else None
        except Exception as e:   # an import or library error: the run must not go on natively
            pytest.exit(f"strata suite: strata_torch cannot be used here: {e!r}", returncode=3)
        if backend != "strata":
            pytest.exit(f"strata suite: strata is not PyTorch's allocator backend in this process (backend: "
                        f"{backend!r}); the run under strata would test PyTorch's own allocator", returncode=3)
    provided = provide_missing_names()  # missing_names.py: Note [Test files from another PyTorch]
    if provided:
        print(f"strata suite: provided for test files from another PyTorch: {', '.join(provided)}")
    config.pluginmanager.register(_Suite(config), "strata_suite")


class _Suite:
    def __init__(self, config):
        split = config.getoption("--suite-split")
        self.split = parse_split(split) if split else None
        self.budget = config.getoption("--suite-budget")
        path = config.getoption("--suite-record")
        self.record = open(path, "a", encoding="utf-8") if path else None
        self.start = time.monotonic()
        self.results = {}
        self.left_out = []

    def _write(self, entry):
        if self.record is not None:
            self.record.write(json.dumps(entry) + "\n")
            self.record.flush()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if self.split is None:
            return
        index, count = self.split
        kept = [item for position, item in enumerate(items) if in_part(position, index, count)]
        dropped = [item for position, item in enumerate(items) if not in_part(position, index, count)]
        items[:] = kept
        config.hook.pytest_deselected(items=dropped)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.budget is not None and time.monotonic() - self.start > self.budget:
            self.left_out.append(item.nodeid)
            self._write({"nodeid": item.nodeid, "not_run": "budget"})
            return True   # handled: not run, so it appears in no report
        self._write({"nodeid": item.nodeid, "started": round(time.monotonic() - self.start, 1)})
        return None

    def pytest_runtest_logreport(self, report):
        # One outcome per test, as pytest's junit writer sees it: a failing setup or teardown is an error, a
        # failing call a failure, an expected failure a skip of type xfail.
        if report.when == "call":
            outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        elif report.failed:
            outcome = "error"
        elif report.skipped:
            outcome = "skipped"
        else:
            return
        message = ""
        if isinstance(report.longrepr, tuple):   # a skip: (file, line, reason)
            message = str(report.longrepr[-1])[:300]
        elif report.longrepr is not None and outcome != "passed":
            crash = getattr(report.longrepr, "reprcrash", None)
            lines = [line for line in report.longreprtext.splitlines() if line.strip()]
            message = (crash.message if crash is not None else lines[-1] if lines else "").strip()[:300]
        old = self.results.get(report.nodeid)
        if old is None or _OUTCOME_ORDER[outcome] > _OUTCOME_ORDER[old[0]]:
            self.results[report.nodeid] = (outcome, message)

    def pytest_runtest_logfinish(self, nodeid, location):
        if nodeid in self.results:
            outcome, message = self.results[nodeid]
            self._write({"nodeid": nodeid, "outcome": outcome, "message": message,
                         "at": round(time.monotonic() - self.start, 1)})

    def pytest_terminal_summary(self, terminalreporter):
        if self.left_out:
            terminalreporter.write_line(f"strata suite: {len(self.left_out)} tests not started: the budget of "
                                        f"{self.budget:.0f} s was spent (first: {self.left_out[0]})")

    def pytest_unconfigure(self, config):
        if self.record is not None:
            self.record.close()
