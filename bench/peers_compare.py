#!/usr/bin/env python3
"""Tables of two trees' bench/peers runs side by side, from their --json files, for runs interleaved on one
machine: before1 after1 before2 after2. Each cell: both runs of the tree before -> both runs of the tree after.
  python3 bench/peers_compare.py BEFORE1.json AFTER1.json BEFORE2.json AFTER2.json"""
import json
import sys

STACKS = ["strata coalescing_pool", "strata stream_ordered<coalescing_pool>", "strata stream_ordered<size_class_pool>",
          "strata mapped_pool", "strata default_pool", "strata default_pool (relocate idle: the plug-in's default)"]
REPLAYED = ["strata default_pool", "strata default_pool (relocate idle: the plug-in's default)", "strata mapped_pool",
            "strata coalescing_pool", "strata stream_ordered<coalescing_pool>"]
RANDOM = ["strata coalescing_pool", "strata stream_ordered<coalescing_pool>", "strata mapped_pool", "strata default_pool",
          "strata default_pool (relocate idle: the plug-in's default)", "cudaMallocAsync (created stream)"]


def size_label(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def cell(values, fmt):
    b1, a1, b2, a2 = values
    return f"{b1:{fmt}}/{b2:{fmt}} → {a1:{fmt}}/{a2:{fmt}}"


def replay_row(run, trace, stack):
    for t in run["replay"]:
        if t["trace"].split("/")[-1] == trace:
            for r in t["results"]:
                if r["stack"] == stack:
                    return r
    return None


def main(paths):
    if len(paths) != 4:
        sys.exit(__doc__)
    runs = [json.load(open(p)) for p in paths]
    sizes = runs[1]["pair_sizes"]
    print("## Pair latency, ns per pair (before, both runs → after, both runs)\n")
    print("| stack | " + " | ".join(size_label(s) for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for stack in STACKS:
        cells = [cell([r["pair_ns"][stack][i] for r in runs], ".0f") for i in range(len(sizes))]
        print(f"| {stack} | " + " | ".join(cells) + " |")
    print("\n## Replay on device memory from a fresh pool: ns per operation and held/live (before → after)\n")
    print("| trace | stack | ns/op | held/live |")
    print("|---|---|---|---|")
    for t in runs[1]["replay"]:
        trace = t["trace"].split("/")[-1]
        for stack in REPLAYED:
            rows = [replay_row(r, trace, stack) for r in runs]
            if None in rows:
                continue
            name = trace.replace(".csv.gz", "")
            print(f"| {name} | {stack} | {cell([x['ns_per_op'] for x in rows], '.0f')} | {cell([x['ratio'] for x in rows], '.3f')} |")
    print("\n## Random allocations, ns per operation (before → after)\n")
    print("| stack | uniform | log-uniform |")
    print("|---|---|---|")
    for stack in RANDOM:
        rows = [r["random"][stack] for r in runs]
        print(f"| {stack} | {cell([x['uniform'] for x in rows], '.0f')} | {cell([x['log_uniform'] for x in rows], '.0f')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
