#!/usr/bin/env python3
"""Summarizes speed_verdict.sh's runs: per model, the same-round ratio strata/native over interleaved rounds.

Each process's speed is its measured steps over its measured time (the harmonic mean of its windows' steps/s).
The verdict per model: the median of the rounds' ratios at least 0.99 (within 1% of native), with
the range and both allocators' medians printed beside it, and rounds that failed or were not run counted.
    python3 speed_verdict.py runs.jsonl [more.jsonl ...] [--markdown verdict.md]
Exits 1 when a model misses, 2 when a model has no complete round.
"""
import argparse
import json
import statistics
import sys

THRESHOLD = 0.99


def rate(steps_per_s):
    """Steps per second over all windows together: windows of equal steps, so the harmonic mean."""
    return len(steps_per_s) / sum(1.0 / v for v in steps_per_s)


def summarize(records):
    """{model: summary} from runs.jsonl records (dicts)."""
    models = {}
    for r in records:
        m = models.setdefault(r["model"], {"rounds": {}, "failed": 0, "not_run": 0})
        if r.get("not_run"):
            m["not_run"] += 1
        elif r.get("failed") or not r.get("steps_per_s"):
            m["failed"] += 1
        else:
            m["rounds"].setdefault(r["round"], {})[r["alloc"]] = rate(r["steps_per_s"])
    out = {}
    for model, m in models.items():
        pairs = [(v["native"], v["strata"]) for _, v in sorted(m["rounds"].items()) if "native" in v and "strata" in v]
        s = {"rounds": len(pairs), "failed": m["failed"], "not_run": m["not_run"]}
        if pairs:
            ratios = [b / a for a, b in pairs]
            natives = [a for a, _ in pairs]
            stratas = [b for _, b in pairs]
            s.update(ratios=ratios, median_ratio=statistics.median(ratios), min_ratio=min(ratios), max_ratio=max(ratios),
                     native_median=statistics.median(natives), strata_median=statistics.median(stratas),
                     native_spread=max(natives) / min(natives), rounds_at_threshold=sum(x >= THRESHOLD for x in ratios))
            s["pass"] = s["median_ratio"] >= THRESHOLD
        out[model] = s
    return out


def lines(summary):
    text = []
    for model, s in summary.items():
        if not s["rounds"]:
            text.append(f"FAIL speed {model}: no complete round ({s['failed']} runs failed, {s['not_run']} rounds not run)")
            continue
        text.append(
            f"{'PASS' if s['pass'] else 'FAIL'} speed {model}: strata/native median {s['median_ratio']:.3f} over "
            f"{s['rounds']} interleaved rounds (range {s['min_ratio']:.3f}-{s['max_ratio']:.3f}; "
            f"{s['rounds_at_threshold']} of {s['rounds']} at >= {THRESHOLD}); steps/s median native "
            f"{s['native_median']:.2f} (max/min {s['native_spread']:.3f}), strata {s['strata_median']:.2f}"
            + (f"; {s['failed']} runs failed" if s["failed"] else "") + (f"; {s['not_run']} rounds not run" if s["not_run"] else ""))
    return text


def markdown(summary):
    rows = ["| workload | rounds | strata / native, median | range | rounds >= 0.99 | native steps/s (median, max/min) | strata steps/s |",
            "| --- | ---: | ---: | --- | ---: | --- | ---: |"]
    for model, s in summary.items():
        if s["rounds"]:
            rows.append(f"| {model} | {s['rounds']} | {s['median_ratio']:.3f} | {s['min_ratio']:.3f}-{s['max_ratio']:.3f} | "
                        f"{s['rounds_at_threshold']} | {s['native_median']:.2f} ({s['native_spread']:.3f}) | {s['strata_median']:.2f} |")
    return "\n".join(rows) + "\n"


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--markdown")
    args = p.parse_args(argv)
    records = [json.loads(line) for path in args.runs for line in open(path) if line.strip()]
    summary = summarize(records)
    for line in lines(summary):
        print(line)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(summary))
    if any(not s["rounds"] for s in summary.values()):
        return 2
    return 0 if all(s["pass"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
