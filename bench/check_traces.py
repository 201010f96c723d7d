#!/usr/bin/env python3
"""Every trace of bench/traces through bench/replay (x1.0, simulated memory), checked against the figures
recorded in bench/traces/expected.json: per stack, peak live and peak held bytes, allocations taken from the
device, and the page-mapped stacks' driver calls. These figures are exact on any machine, so a change in what a
pool holds or asks of the driver shows here as a difference, stack by stack; a change meant to make it is
recorded with --update (and the tables of docs/memory.md made again with bench/replay_all.sh).

    python3 bench/check_traces.py --replay BUILD/bench/replay [--update]
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.join(HERE, "traces")
EXPECTED = os.path.join(TRACES, "expected.json")
CALLS = ("creates", "maps", "unmaps", "releases", "access_calls", "device_waits")


def figures(replay, trace):
    """{stack: {figure: value}} of one trace at x1.0."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "replay.json")
        run = subprocess.run([replay, trace, "--json", out], capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"{replay} {trace}: exit {run.returncode}\n{run.stderr[-2000:]}")
        with open(out) as f:
            results = json.load(f)["results"]
    table = {}
    for r in results:
        if r["failed"]:
            raise SystemExit(f"{os.path.basename(trace)}: {r['stack']} failed the replay")
        row = {"peak_live": r["peak_live"], "peak_reserved": r["peak_reserved"],
               "upstream_allocations": r["upstream_allocations"]}
        row.update({k: r["page_calls"][k] for k in CALLS if "page_calls" in r})
        table[r["stack"]] = row
    return table


def differences(name, expected, got):
    lines = []
    for stack in sorted(set(expected) | set(got)):
        if stack not in got or stack not in expected:
            lines.append(f"{name}: stack {stack!r} {'gone' if stack not in got else 'new'}")
            continue
        for key in sorted(set(expected[stack]) | set(got[stack])):
            was, now = expected[stack].get(key), got[stack].get(key)
            if was != now:
                lines.append(f"{name}: {stack}: {key} {was} -> {now}")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replay", required=True, help="bench/replay as built")
    p.add_argument("--update", action="store_true", help="record the figures of this build as the expected ones")
    a = p.parse_args()
    traces = sorted(glob.glob(os.path.join(TRACES, "*.csv.gz")))
    if not traces:
        raise SystemExit(f"no traces in {TRACES}")
    got = {os.path.basename(t).replace(".csv.gz", ""): figures(a.replay, t) for t in traces}
    if a.update:
        with open(EXPECTED, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"recorded {len(got)} traces in {EXPECTED}")
        return 0
    with open(EXPECTED) as f:
        expected = json.load(f)
    lines = []
    for name in sorted(set(expected) | set(got)):
        if name not in got or name not in expected:
            lines.append(f"trace {name}: {'no longer in bench/traces' if name not in got else 'has no expected figures (--update)'}")
            continue
        lines += differences(name, expected[name], got[name])
    stacks = sum(len(t) for t in got.values())
    if lines:
        print("\n".join(lines))
        print(f"FAIL: {len(lines)} figures differ from bench/traces/expected.json ({len(got)} traces, {stacks} replays)")
        return 1
    print(f"PASS: {len(got)} traces, {stacks} replays: every figure as recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
