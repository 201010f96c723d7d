#!/usr/bin/env python3
"""Two trees' bench/peers runs side by side, from their --json files, for runs interleaved on one machine
(before, after, before, after, ...). Each cell: the median of the tree before's runs -> the median of the tree
after's, each side's range in brackets; the last column says whether the after side is slower beyond the
spread (its fastest run slower than the before side's slowest). Parts a run lacks (peers --parts) are left out.
  python3 bench/peers_compare.py BEFORE1.json AFTER1.json [BEFORE2.json AFTER2.json ...]"""
import json
import statistics
import sys

STACKS = ["strata coalescing_pool", "strata stream_ordered<coalescing_pool>", "strata stream_ordered<size_class_pool>",
          "strata mapped_pool", "strata default_pool", "strata default_pool (relocate idle: the plug-in's default)"]
REPLAYED = ["strata default_pool", "strata default_pool (relocate idle: the plug-in's default)", "strata mapped_pool",
            "strata coalescing_pool", "strata stream_ordered<coalescing_pool>"]
RANDOM = ["strata coalescing_pool", "strata stream_ordered<coalescing_pool>", "strata mapped_pool", "strata default_pool",
          "strata default_pool (relocate idle: the plug-in's default)"]


def size_label(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def side(values, fmt):
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}–{max(values):{fmt}}]"


def compare(before, after, fmt):
    """The cell, and whether the after side is slower beyond the spread."""
    slower = min(after) > max(before)
    return f"{side(before, fmt)} → {side(after, fmt)}", slower


def replay_row(run, trace, stack):
    for t in run.get("replay", []):
        if t["trace"].split("/")[-1] == trace:
            for r in t["results"]:
                if r["stack"] == stack and not r.get("failed"):
                    return r
    return None


def pair_table(before, after):
    sizes = after[0]["pair_sizes"]
    lines = ["## Pair latency, ns per pair: median [range] before → after\n",
             "| stack | " + " | ".join(size_label(s) for s in sizes) + " |", "|---|" + "---|" * len(sizes)]
    slower = []
    for stack in STACKS:
        if any(stack not in r.get("pair_ns", {}) for r in before + after):
            continue
        cells = []
        for i, s in enumerate(sizes):
            text, worse = compare([r["pair_ns"][stack][i] for r in before], [r["pair_ns"][stack][i] for r in after], ".0f")
            cells.append(text + (" **slower**" if worse else ""))
            if worse:
                slower.append(f"pair {stack} {size_label(s)}")
        lines.append(f"| {stack} | " + " | ".join(cells) + " |")
    return lines, slower


def replay_table(before, after):
    lines = ["## Replay on device memory from a fresh pool: ns per operation, held/live; before → after\n",
             "| trace | stack | ns/op | held/live |", "|---|---|---|---|"]
    slower = []
    for t in after[0].get("replay", []):
        trace = t["trace"].split("/")[-1]
        for stack in REPLAYED:
            b = [replay_row(r, trace, stack) for r in before]
            a = [replay_row(r, trace, stack) for r in after]
            if None in b or None in a:
                continue
            text, worse = compare([x["ns_per_op"] for x in b], [x["ns_per_op"] for x in a], ".0f")
            ratio, _ = compare([x["ratio"] for x in b], [x["ratio"] for x in a], ".3f")
            name = trace.replace(".csv.gz", "")
            lines.append(f"| {name} | {stack} | {text}{' **slower**' if worse else ''} | {ratio} |")
            if worse:
                slower.append(f"replay {name} {stack}")
    return lines, slower


def random_table(before, after):
    lines = ["## Random allocations, ns per operation: before → after\n", "| stack | uniform | log-uniform |", "|---|---|---|"]
    for stack in RANDOM:
        if any(stack not in r.get("random", {}) for r in before + after):
            continue
        u, _ = compare([r["random"][stack]["uniform"] for r in before], [r["random"][stack]["uniform"] for r in after], ".0f")
        g, _ = compare([r["random"][stack]["log_uniform"] for r in before], [r["random"][stack]["log_uniform"] for r in after], ".0f")
        lines.append(f"| {stack} | {u} | {g} |")
    return lines if len(lines) > 3 else []


def main(paths):
    if len(paths) < 2 or len(paths) % 2:
        sys.exit(__doc__)
    runs = [json.load(open(p)) for p in paths]
    before, after = runs[0::2], runs[1::2]
    out, slower = [], []
    if all(any(r.get("pair_ns", {}).values()) for r in runs):  # a run without the pair part lists empty rows
        lines, s = pair_table(before, after)
        out += lines + [""]
        slower += s
    if all(r.get("replay") for r in runs):
        lines, s = replay_table(before, after)
        out += lines + [""]
        slower += s
    if all(r.get("random") for r in runs):
        out += random_table(before, after) + [""]
    print("\n".join(out))
    print("slower beyond the spread: " + ("; ".join(slower) if slower else "none"))


if __name__ == "__main__":
    main(sys.argv[1:])
