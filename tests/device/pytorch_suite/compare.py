#!/usr/bin/env python3
"""Judge a PyTorch test-suite run under strata against the same run under PyTorch's own allocator.

    compare.py --native N1.xml [N2.xml ...] --strata S1.xml [S2.xml ...] [--exceptions FILE] [--report FILE]
    compare.py --exceptions FILE --table        # the listed exceptions as a Markdown table (docs/pytorch.md)

Inputs are pytest's junit XML (--junitxml), or the JSON-lines record suite_plugin.py writes test by test (kept
when a run is killed before pytest could write its XML); several files per side are merged (shards). A test is
named "<module>::<Class>::<test>" (test_cuda::TestCuda::test_memory_stats), whatever directory the files were
run from.

Every test that passed natively must pass under strata, or match a line of the exceptions file. A native pass
that failed, errored, was skipped or did not run under strata is a regression. The exceptions file has one
test per line, "<name> <reason>" ('*' in the name matches any run of characters; '#' starts a comment); a line
without a reason is refused, since the reason is what docs/pytorch.md shows.

Exit status: 0 when there is no regression (and at least one test passed natively: an empty run proves
nothing); 1 when there are regressions; 2 when the input cannot be read. Pure Python, no third-party module.
"""

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

PASSED, FAILED, ERROR, SKIPPED, XFAILED = "passed", "failed", "error", "skipped", "xfailed"
# Where one test has several results (repeated across shards, or a teardown error after a pass), the worst
# one stands: a native pass must be a clean pass to be demanded, and a strata pass must be clean to count.
_SEVERITY = {PASSED: 0, XFAILED: 1, SKIPPED: 2, FAILED: 3, ERROR: 4}


class InputError(Exception):
    """A results or exceptions file that cannot be read as such."""


def _name_from_parts(parts, test):
    """<module>::<Class...>::<test> from a dotted or path-split class name: the module is the last part named
    test_*, so the directory a run started from does not change the name."""
    parts = [p for p in parts if p]
    modules = [i for i, p in enumerate(parts) if p.startswith("test_")]
    if modules:
        parts = parts[modules[-1]:]
    return "::".join(parts + [test])


def name_from_junit(classname, name):
    return _name_from_parts((classname or "").split("."), name)


def name_from_nodeid(nodeid):
    path, _, rest = nodeid.partition("::")
    stem = os.path.splitext(os.path.basename(path))[0]
    pieces = rest.split("::")
    return _name_from_parts([stem] + pieces[:-1], pieces[-1])


def _first_line(text, limit=200):
    for line in (text or "").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[:limit - 3] + "..."
    return ""


def _outcome_of_testcase(case):
    kinds = {child.tag: child for child in case}
    for tag, outcome in (("error", ERROR), ("failure", FAILED)):
        if tag in kinds:
            child = kinds[tag]
            return outcome, _first_line(child.get("message") or child.text)
    if "skipped" in kinds:
        child = kinds["skipped"]
        outcome = XFAILED if child.get("type") == "pytest.xfail" else SKIPPED
        return outcome, _first_line(child.get("message") or child.text)
    return PASSED, ""


def read_junit(path):
    """{name: (outcome, message)} from one junit XML file."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        raise InputError(f"{path}: not a readable junit XML file ({e})") from e
    if root.tag not in ("testsuites", "testsuite"):
        raise InputError(f"{path}: the root element is <{root.tag}>, not <testsuites> or <testsuite>")
    results = {}
    for case in root.iter("testcase"):
        name = name_from_junit(case.get("classname"), case.get("name", ""))
        _merge(results, name, _outcome_of_testcase(case))
    return results


def read_jsonl(path):
    """{name: (outcome, message)} from suite_plugin.py's record: one JSON object per finished test."""
    results = {}
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}:{number}: not JSON ({e})") from e
                if "outcome" not in entry:
                    continue   # a "started" line: the test began but did not finish
                if entry["outcome"] not in _SEVERITY:
                    raise InputError(f"{path}:{number}: unknown outcome {entry['outcome']!r}")
                _merge(results, name_from_nodeid(entry["nodeid"]), (entry["outcome"], entry.get("message", "")))
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e})") from e
    return results


def _merge(results, name, result):
    old = results.get(name)
    if old is None or _SEVERITY[result[0]] > _SEVERITY[old[0]]:
        results[name] = result


def read_results(paths):
    merged = {}
    for path in paths:
        one = read_jsonl(path) if path.endswith(".jsonl") else read_junit(path)
        for name, result in one.items():
            _merge(merged, name, result)
    return merged


class Excuse:
    """One line of the exceptions file: a test name, '*' matching any run of characters, and why."""

    def __init__(self, pattern, reason, where):
        self.pattern, self.reason, self.where = pattern, reason, where
        self._regex = re.compile("^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "$")

    def matches(self, name):
        return bool(self._regex.match(name))


def read_exceptions(path):
    if path is None:
        return []
    found = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e})") from e
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, _, reason = line.replace("\t", " ").partition(" ")
        reason = reason.strip()
        if not reason:
            raise InputError(f"{path}:{number}: {pattern!r} has no reason; each exception says why it cannot pass")
        if pattern.strip("*") == "":
            raise InputError(f"{path}:{number}: {pattern!r} would excuse every test")
        found.append(Excuse(pattern, reason, f"{path}:{number}"))
    return found


def compare(native, strata, exceptions):
    """The verdict over two result maps: a dict of lists, plus 'ok'."""
    demanded = sorted(name for name, (outcome, _) in native.items() if outcome == PASSED)
    regressions, excused, kept = [], [], 0
    used = set()
    for name in demanded:
        outcome, message = strata.get(name, ("not run", ""))
        if outcome == PASSED:
            kept += 1
            continue
        excuse = next((e for e in exceptions if e.matches(name)), None)
        if excuse is not None:
            used.add(excuse.pattern)
            excused.append((name, outcome, excuse.reason))
        else:
            regressions.append((name, outcome, message))
    needless = sorted({e.pattern for e in exceptions
                       if any(e.matches(n) and strata.get(n, ("",))[0] == PASSED for n in demanded)} - used)
    unmatched = sorted(e.pattern for e in exceptions
                       if e.pattern not in used and e.pattern not in needless)
    strata_only = sorted(name for name, (outcome, _) in strata.items()
                         if outcome == PASSED and native.get(name, ("not run",))[0] != PASSED)
    return {"demanded": demanded, "kept": kept, "regressions": regressions, "excused": excused,
            "needless_exceptions": needless, "unmatched_exceptions": unmatched, "strata_only_passes": strata_only,
            "ok": bool(demanded) and not regressions}


def _counts(results):
    by_module = {}
    for name, (outcome, _) in results.items():
        module = name.split("::", 1)[0]
        by_module.setdefault(module, {k: 0 for k in _SEVERITY})[outcome] += 1
    return by_module


def report(native, strata, verdict):
    lines = ["PyTorch's tests: native (PyTorch's allocator) against strata", ""]
    lines.append(f"{'module':<28} {'run':<7} " + " ".join(f"{k:>8}" for k in _SEVERITY))
    for side, results in (("native", native), ("strata", strata)):
        for module, counts in sorted(_counts(results).items()):
            lines.append(f"{module:<28} {side:<7} " + " ".join(f"{counts[k]:>8}" for k in _SEVERITY))
    lines.append("")
    lines.append(f"passed natively: {len(verdict['demanded'])}; passed under strata too: {verdict['kept']}; "
                 f"listed exceptions: {len(verdict['excused'])}; regressions: {len(verdict['regressions'])}")
    if verdict["regressions"]:
        lines += ["", "Regressions (passed natively, not under strata):"]
        lines += [f"  {outcome:<8} {name}" + (f"\n           {message}" if message else "")
                  for name, outcome, message in verdict["regressions"]]
    if verdict["excused"]:
        lines += ["", "Listed exceptions (passed natively, not under strata):"]
        lines += [f"  {outcome:<8} {name}\n           {reason}" for name, outcome, reason in verdict["excused"]]
    if verdict["needless_exceptions"]:
        lines += ["", "Exceptions whose tests now pass under strata (remove them):"]
        lines += [f"  {p}" for p in verdict["needless_exceptions"]]
    if verdict["unmatched_exceptions"]:
        lines += ["", "Exceptions matching no native pass in these results (another shard's, or stale):"]
        lines += [f"  {p}" for p in verdict["unmatched_exceptions"]]
    if verdict["strata_only_passes"]:
        lines += ["", f"Passed under strata but not natively: {len(verdict['strata_only_passes'])}"]
        lines += [f"  {n}" for n in verdict["strata_only_passes"]]
    lines.append("")
    if not verdict["demanded"]:
        lines.append("FAIL: no test passed natively, so this run judged nothing")
    elif verdict["ok"]:
        lines.append(f"PASS: all {len(verdict['demanded'])} tests that passed natively passed under strata "
                     f"or are listed exceptions ({len(verdict['excused'])})")
    else:
        lines.append(f"FAIL: {len(verdict['regressions'])} of {len(verdict['demanded'])} tests that passed "
                     f"natively did not pass under strata and are not listed exceptions")
    return "\n".join(lines) + "\n"


def table(exceptions):
    rows = ["| test | why it cannot pass under strata |", "| --- | --- |"]
    for e in exceptions:
        reason = e.reason.replace("|", "\\|")
        rows.append(f"| `{e.pattern}` | {reason} |")
    return "\n".join(rows) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--native", nargs="+", default=[], help="junit XML or .jsonl of the native run(s)")
    parser.add_argument("--strata", nargs="+", default=[], help="junit XML or .jsonl of the run(s) under strata")
    parser.add_argument("--exceptions", help="the known-exceptions file")
    parser.add_argument("--report", help="also write the report to this file")
    parser.add_argument("--table", action="store_true", help="print the exceptions as a Markdown table, and stop")
    args = parser.parse_args(argv)
    try:
        exceptions = read_exceptions(args.exceptions)
        if args.table:
            sys.stdout.write(table(exceptions))
            return 0
        if not args.native or not args.strata:
            parser.error("--native and --strata each need at least one results file")
        native, strata = read_results(args.native), read_results(args.strata)
    except InputError as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 2
    verdict = compare(native, strata, exceptions)
    text = report(native, strata, verdict)
    sys.stdout.write(text)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            f.write(text)
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
