#!/usr/bin/env python3
"""Writes strata-plan reports (plan.md's report JSON) for the viewer's tests, deterministically (seeded).

The default report is the committed fixture tests/viewer/report_fixture.json: two traces x three stacks,
simulated from a training-like and a serving-like workload. One trace's timelines are NOT downsampled (4,000
points, more than the planner's 2,000) so the page's own downsampling is exercised, and its first stack's map
holds more than 1,000 blocks. `--big` writes the speed check's report: 400,000 timeline points per stack and
a 20,000-block map. Standard library only.

    python3 tests/viewer/make_report.py > tests/viewer/report_fixture.json
    python3 tests/viewer/make_report.py --big > big.json
"""
import argparse
import json
import random
import sys

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def round_up(n, to):
    return (n + to - 1) // to * to


def workload(rng, kind, ops):
    """Live bytes after each operation. 'training': steps that build activations up and free them in
    reverse (with weights held throughout); 'serving': requests of random sizes that come and go."""
    live, held, out = 0, [], []
    if kind == 'training':
        weights = 3 * GiB + rng.randrange(512) * MiB
        live = weights
        step_ops = max(50, min(ops // 12, 2000))
        while len(out) < ops:
            for _ in range(step_ops // 2):  # forward: activations pile up
                size = round_up(rng.choice([rng.randrange(1, 64) * 64 * KiB, rng.randrange(2, 96) * MiB]), 512)
                held.append(size)
                live += size
                out.append(live)
            while held and len(out) < ops + step_ops:  # backward: freed in reverse, gradients come and go
                live -= held.pop()
                out.append(live)
        return out[:ops]
    while len(out) < ops:
        if held and (rng.random() < 0.48 or live > 14 * GiB):
            live -= held.pop(rng.randrange(len(held)))
        else:
            size = round_up(rng.randrange(1, 400) * MiB + rng.randrange(4096) * 256, 512)
            held.append(size)
            live += size
        out.append(live)
    return out


def reserved_for(rng, live, style):
    """Reserved bytes of a stack that follows `live`: pools grow in chunks and keep them (a little
    fragmentation on top); the per-tensor baseline reserves what is live, rounded per tensor."""
    out, reserved = [], 0
    for i, l in enumerate(live):
        if style == 'baseline':
            reserved = round_up(int(l * 1.012), 2 * MiB)
        else:
            waste = 1.03 if style == 'pool' else 1.19
            chunk = 32 * MiB if style == 'pool' else 20 * MiB
            need = int(l * waste)
            if need > reserved:
                reserved = round_up(need, chunk)
        out.append(reserved)
    return out


def timeline(live, reserved, points):
    """Like the planner: at most `points` buckets, keeping each bucket's maximum (None: every point)."""
    n = len(live)
    if points is None or n <= points:
        return {"op": list(range(1, n + 1)), "live": live, "reserved": reserved}
    per = -(-n // points)
    op, lv, rs = [], [], []
    for start in range(0, n, per):
        end = min(n, start + per)
        op.append(end)
        lv.append(max(live[start:end]))
        rs.append(max(reserved[start:end]))
    return {"op": op, "live": lv, "reserved": rs}


def snapshot(rng, box, reserved, blocks_wanted, streams, segment_sizes, hole=0):
    """A pool's memory as strata::to_json writes it: segments of the given sizes, each cut into used blocks
    and free holes covering it exactly, about `blocks_wanted` blocks in all; with `hole`, the largest segment
    gets one free hole of at least that many bytes (left free by a tensor that died)."""
    segments, address = [], 0x7f0000000000
    total = sum(segment_sizes)
    for size in segment_sizes:
        want = max(1, blocks_wanted * size // total)
        cuts = sorted(rng.sample(range(1, size // 512), min(want - 1, size // 512 - 2))) if want > 1 else []
        edges = [0] + [c * 512 for c in cuts] + [size]
        blocks, previous_free = [], True
        for a, b in zip(edges, edges[1:]):
            free = (not previous_free) and rng.random() < 0.3  # holes between used blocks, never two in a row
            blocks.append({"offset": a, "size": b - a, "free": free,
                           "stream": -1 if free or not streams else rng.choice(streams)})
            previous_free = free
        if hole and size == max(segment_sizes):
            first = len(blocks) // 2
            last = first
            while last < len(blocks) - 1 and blocks[last]["offset"] + blocks[last]["size"] - blocks[first]["offset"] < hole:
                last += 1
            merged = {"offset": blocks[first]["offset"], "size": blocks[last]["offset"] + blocks[last]["size"] - blocks[first]["offset"],
                      "free": True, "stream": -1}
            blocks[first:last + 1] = [merged]
            for neighbour in (first - 1, first + 1):  # keep holes maximal: the pool merges free neighbours
                if 0 <= neighbour < len(blocks):
                    blocks[neighbour]["free"] = False
            hole = 0
        segments.append({"address": address, "size": size, "blocks": blocks})
        address += round_up(size, 2 * MiB) + 2 * MiB
    return {"box": box, "segments": segments}


def request_place(snap, size):
    """Where the biggest request would go: the first free block that fits (address order), or None."""
    for i, seg in enumerate(snap["segments"]):
        for b in seg["blocks"]:
            if b["free"] and b["size"] >= size:
                return {"size": size, "segment": i, "offset": b["offset"]}
    return {"size": size, "segment": None, "offset": None}


def largest_free(snap):
    return max((b["size"] for s in snap["segments"] for b in s["blocks"] if b["free"]), default=0)


STACKS = [
    ("default_pool", "the recommended stack: stream_ordered<coalescing_pool> (simulated twin planning_pool)", 'pool'),
    ("cudamalloc_baseline", "baseline: every allocation its own cudaMalloc (2 MiB rounding)", 'baseline'),
    ("pytorch_like_caching", "baseline: a model of PyTorch's caching allocator (512 B rounding, 2/20 MiB segments)", 'torch'),
]


def stack_entry(rng, name, description, style, live, capacity, points, blocks_wanted, streams, request, hole=0):
    reserved = reserved_for(rng, live, style)
    peak_at = max(range(len(reserved)), key=lambda i: (reserved[i], -i))
    peak_reserved, peak_live = reserved[peak_at], max(live)
    if style == 'baseline':
        sizes = [round_up(rng.randrange(1, 96) * MiB, 2 * MiB) for _ in range(min(blocks_wanted, 400))]
    elif style == 'pool':
        sizes, left, chunk = [], peak_reserved, 2 * MiB
        while left > 0:
            sizes.append(min(chunk, left))
            left -= sizes[-1]
            chunk = min(chunk * 2, 1 * GiB)
    else:
        sizes, left = [], peak_reserved
        while left > 0:
            sizes.append(min(rng.choice([2 * MiB, 20 * MiB, 64 * MiB, 256 * MiB]), left))
            left -= sizes[-1]
    scale = peak_reserved / sum(sizes)
    sizes = [max(2 * MiB, round_up(int(s * scale), 2 * MiB)) for s in sizes]
    if style == 'baseline':  # one cudaMalloc per tensor: every segment is one used block
        blocks_wanted = len(sizes)
    snap = snapshot(rng, name, peak_reserved, blocks_wanted, streams, sizes, hole)
    upstream = len(sizes) if style != 'baseline' else len(live) // 2
    min_cap = sum(sizes)
    return {
        "name": name, "description": description,
        "peak_live": peak_live, "peak_reserved": min_cap, "ratio": round(min_cap / peak_live, 4),
        "largest_free_at_peak": largest_free(snap), "upstream_calls": upstream,
        "map_calls": None, "unmap_calls": None,
        "fits": None if capacity is None else min_cap <= capacity, "min_capacity": min_cap,
        "timeline": timeline(live, reserved, points),
        "peak_map": {"at_op": peak_at + 1, "snapshot": snap, "largest_request": request_place(snap, request)},
    }


def report(big):
    rng = random.Random(18)
    traces = []
    if big:
        live = workload(rng, 'training', 400_000)
        stacks = [stack_entry(rng, n, d, st, live, None, None, 21_000 if i == 0 else 500, [], 96 * MiB)
                  for i, (n, d, st) in enumerate(STACKS[:2])]
        traces.append({"trace": "synthetic_400k", "operations": len(live), "scale": 1.0, "capacity": None,
                       "stacks": stacks})
        blocks = sum(len(seg["blocks"]) for seg in stacks[0]["peak_map"]["snapshot"]["segments"])
        assert blocks >= 20_000 and all(len(s["timeline"]["op"]) == 400_000 for s in stacks), blocks
    else:
        live = workload(rng, 'training', 4_000)
        traces.append({"trace": "training_step (timelines not downsampled)", "operations": len(live), "scale": 1.0,
                       "capacity": 80 * GiB,
                       "stacks": [stack_entry(rng, n, d, st, live, 80 * GiB, None, 1_500 if i == 0 else 300, [], 40 * MiB,
                                              48 * MiB if i == 0 else 0)
                                  for i, (n, d, st) in enumerate(STACKS)]})
        live = workload(rng, 'serving', 30_000)
        traces.append({"trace": "inference_server", "operations": len(live), "scale": 1.0, "capacity": 16 * GiB,
                       "stacks": [stack_entry(rng, n, d, st, live, 16 * GiB, 2_000, 400, [1, 2, 3] if i == 0 else [],
                                              2 * GiB if i == 1 else 399 * MiB)
                                  for i, (n, d, st) in enumerate(STACKS)]})
    return {"tool": "strata-plan", "version": 1, "traces": traces}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--big', action='store_true', help="the speed check's report (400,000 points, 20,000 blocks)")
    args = parser.parse_args()
    json.dump(report(args.big), sys.stdout, separators=(',', ':'))
    sys.stdout.write('\n')


if __name__ == '__main__':
    main()
