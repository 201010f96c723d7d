#!/usr/bin/env python3
"""Reads what bench/run_all.sh collected in OUT_DIR and writes summary.md (which programs ran, every table,
per-trace replay tables, each target met or missed against the recommended stack) and a few PNG plots.
   plot.py OUT_DIR"""
import glob
import json
import math
import os
import sys

out = sys.argv[1]


def load(name):
    path = os.path.join(out, name)
    try:
        return json.load(open(path)) if os.path.exists(path) else None
    except ValueError as e:  # a program that died mid-write: say so, keep going
        print(f"{name}: not valid JSON ({e})")
        return None


def text(name, default="?"):
    path = os.path.join(out, name)
    return open(path).read().strip() if os.path.exists(path) else default


peers, threads, streams, pm, micro = (load(n) for n in ("peers.json", "threads.json", "streams.json", "pinned_managed.json", "policies_host.json"))
replays = {}  # (trace, scale) -> results
for path in sorted(glob.glob(os.path.join(out, "replay-*.json"))):
    stem = os.path.basename(path)[len("replay-"):-len(".json")]
    trace, _, scale = stem.rpartition("-x")
    data = load(os.path.basename(path))
    if data:
        replays[(trace, float(scale))] = data["results"]

lines = []
say = lines.append
device = text("device.txt")
commit = os.environ.get("STRATA_COMMIT") or text("commit.txt")
say(f"Device: {device}; commit {commit}\n")


def verdict(ok):
    return "met" if ok else "**missed**"


def num(v, fmt="{:,.1f}"):
    return "failed" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def size_name(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def trace_name(path):
    return os.path.basename(path).split(".")[0]


# ---- Which programs ran --------------------------------------------------------------------------------------
status = [l.split(None, 1) for l in text("status.txt", "").splitlines() if l.strip()]
say("### Programs\n")
say("| program | status |")
say("|---|---|")
for label, rc in status:
    rc = rc.strip()
    say(f"| {label} | " + ("ok" if rc == "0" else "skipped (no GPU)" if rc == "77" else "not built" if rc == "missing"
                          else "timed out" if rc == "124" else f"**failed ({rc})**") + " |")
if peers and peers.get("failures"):
    say("\nMeasurements that failed inside bench/peers (the rest of the run went on):\n")
    for f in peers["failures"]:
        say(f"- {f}")
say("")

# ---- bench/peers ------------------------------------------------------------------------------------------------
targets = []  # (target, figure, met)
recommended = None
if peers:
    recommended = peers.get("recommended")
    stack_kind = {s["name"]: s["peer"] for s in peers.get("stacks", [])}
    peer_names = [n for n, p in stack_kind.items() if p]
    say(f"Recommended stack (fixed before the run): **{recommended}**. RMM: {peers.get('rmm')}; PyTorch: {peers.get('torch')}.\n")
    if recommended not in stack_kind:
        say(f"**The recommended stack is not in this run: no target below can be judged against it.**\n")

    sizes = peers["pair_sizes"]
    say("### Pair latency (ns per allocate+free)\n")
    say("| allocator | " + " | ".join(size_name(s) for s in sizes) + " |")
    say("|---|" + "---:|" * len(sizes))
    for name, row in peers["pair_ns"].items():
        label = f"**{name}**" if name == recommended else name
        say(f"| {label} | " + " | ".join(num(v) for v in row) + " |")
    say("")

    say("### Random allocations (ns per operation)\n")
    say("| allocator | uniform [1 B, 1 MiB] | log-uniform [256 B, 64 MiB] |")
    say("|---|---:|---:|")
    for name, r in peers["random"].items():
        label = f"**{name}**" if name == recommended else name
        say(f"| {label} | {num(r['uniform'])} | {num(r['log_uniform'])} |")
    say("")
    rec = peers["random"].get(recommended)
    ok_peers = {k: v for k, v in peers["random"].items() if k in peer_names}
    for dist in ("uniform", "log_uniform"):
        timed = {k: v[dist] for k, v in ok_peers.items() if v[dist] is not None and not math.isnan(v[dist])}
        if rec and rec[dist] is not None and timed:
            fastest = min(timed, key=timed.get)
            ratio = timed[fastest] / rec[dist]
            targets.append((f"random allocations, {dist}: recommended stack at least 4x faster than the fastest peer",
                            f"{recommended} {rec[dist]:.1f} ns vs {fastest} {timed[fastest]:.1f} ns: {ratio:.2f}x", ratio >= 4))
        else:
            targets.append((f"random allocations, {dist}: recommended stack at least 4x faster than the fastest peer",
                            "not measured (recommended stack or peers absent or failed)", False))

    say("### Replay on device memory (from a fresh allocator; growth counted)\n")
    say("reserved: what the allocator holds from the device by its own count (for PyTorch, its reserved_bytes); "
        "device: the rise in cudaMemGetInfo's used memory over the replay; PyTorch own: its max_memory_reserved / "
        "max_memory_allocated. Allocators that take a stream replay on the trace's streams (0: the legacy "
        "default stream, others created), whatever stream their row names for pair latency and random allocations.\n")
    for tr in peers.get("replay", []):
        say(f"#### {trace_name(tr['trace'])}\n")
        say("| stack | ns/op | peak live MiB | peak reserved MiB | reserved / live | device MiB | device / live | PyTorch own |")
        say("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in tr["results"]:
            label = f"**{r['stack']}**" if r["stack"] == recommended else r["stack"]
            if r["failed"]:
                say(f"| {label} | failed after {r['operations']} ops | | | | | | |")
                continue
            own = f"{r['own_peak_reserved'] / r['own_peak_allocated']:.3f}" if r.get("own_peak_allocated") else ""
            say(f"| {label} | {r['ns_per_op']:.1f} | {r['peak_live'] / 2**20:,.0f} | {r['peak_reserved'] / 2**20:,.0f} | "
                f"{r['ratio']:.3f} | {r['device_peak'] / 2**20:,.0f} | {r['device_ratio']:.3f} | {own} |")
        say("")
        by = {r["stack"]: r for r in tr["results"] if not r["failed"]}
        t = trace_name(tr["trace"])
        rec_r = by.get(recommended)
        exp = next((r for n, r in by.items() if n.startswith("torch expandable")), None)
        dflt = next((r for n, r in by.items() if n.startswith("torch caching")), None)
        if rec_r:
            targets.append((f"{t}, device: recommended stack peak reserved / peak live <= 1.02", f"{rec_r['ratio']:.3f}", rec_r["ratio"] <= 1.02))
            if exp:
                targets.append((f"{t}, device: recommended stack no slower per operation than PyTorch with expandable segments",
                                f"{rec_r['ns_per_op']:.1f} vs {exp['ns_per_op']:.1f} ns", rec_r["ns_per_op"] <= exp["ns_per_op"]))
        co = by.get("strata coalescing_pool")
        if co and dflt:
            targets.append((f"{t}, device: coalescing_pool no worse than PyTorch's default allocator, and <= 1.10",
                            f"{co['ratio']:.3f} vs {dflt['ratio']:.3f}", co["ratio"] <= dflt["ratio"] and co["ratio"] <= 1.10))
        so = by.get("strata stream_ordered<coalescing_pool>")
        if co and so:
            bound = 1.03 if "stream" in t else 1.01
            targets.append((f"{t}, device: stream_ordered<coalescing_pool> within {round((bound - 1) * 100)}% of coalescing_pool",
                            f"{so['ratio']:.3f} vs {co['ratio']:.3f}", so["ratio"] <= co["ratio"] * bound))

# ---- bench/replay (simulated memory, scaled) ---------------------------------------------------------------------
if replays:
    say("### Replay on simulated memory (peak reserved / peak live; sizes x0.9, x1.0, x1.1)\n")
    for trace in sorted({t for t, _ in replays}):
        scales = sorted(s for t, s in replays if t == trace)
        stacks = list(dict.fromkeys(r["stack"] for s in scales for r in replays[(trace, s)]))
        say(f"#### {trace}\n")
        say("| stack | " + " | ".join(f"x{s}" for s in scales) + " | ns/op (x1.0) |")
        say("|---|" + "---:|" * (len(scales) + 1))
        for st in stacks:
            cells = []
            for s in scales:
                r = next((r for r in replays[(trace, s)] if r["stack"] == st), None)
                cells.append("failed" if r is None or r["failed"] else f"{r['ratio']:.3f}")
            base = next((r for r in replays.get((trace, 1.0), []) if r["stack"] == st and not r["failed"]), None)
            say(f"| {st} | " + " | ".join(cells) + f" | {base['ns_per_op']:.1f} |" if base else f"| {st} | " + " | ".join(cells) + " | |")
        say("")
        short = recommended.removeprefix("strata ") if recommended else None
        for s in scales:
            rs = {r["stack"]: r for r in replays[(trace, s)] if not r["failed"]}
            co = rs.get("coalescing_pool (defaults)")
            if co:
                targets.append((f"{trace} x{s}, simulated: coalescing_pool <= 1.10", f"{co['ratio']:.3f}", co["ratio"] <= 1.10))
            rec_sim = next((r for n, r in rs.items() if short and n.startswith(short)), None)
            if rec_sim:
                targets.append((f"{trace} x{s}, simulated: recommended stack <= 1.02", f"{rec_sim['ratio']:.3f}", rec_sim["ratio"] <= 1.02))
            so = next((r for n, r in rs.items() if n.startswith("stream_ordered<coalescing_pool> (trace streams, work done at once)")), None)
            if so and co:
                bound = 1.03 if "stream" in trace else 1.01
                targets.append((f"{trace} x{s}, simulated: stream_ordered<coalescing_pool> within {round((bound - 1) * 100)}% of coalescing_pool",
                                f"{so['ratio']:.3f} vs {co['ratio']:.3f}", so["ratio"] <= co["ratio"] * bound))

if targets:
    say("### Targets, against the recommended stack where they name it\n")
    say("| target | figure | verdict |")
    say("|---|---|---|")
    for t, fig, ok in targets:
        say(f"| {t} | {fig} | {verdict(ok)} |")
    met = sum(1 for *_, ok in targets if ok)
    say(f"\n{met} of {len(targets)} met.\n")

# ---- The other programs ---------------------------------------------------------------------------------------
if threads:
    say(f"### Threads ({threads['memory']} memory), million operations per second\n")
    stacks = list(dict.fromkeys(r["stack"] for r in threads["results"]))
    counts = sorted({r["threads"] for r in threads["results"]})
    say("| stack | " + " | ".join(f"{t} thr" for t in counts) + " | scaling at 16 |")
    say("|---|" + "---:|" * (len(counts) + 1))
    for s in stacks:
        row = {r["threads"]: r["mops"] for r in threads["results"] if r["stack"] == s}
        scaling = f"{row[16] / row[1]:.2f}x" if row.get(1) and 16 in row else ""
        say(f"| {s} | " + " | ".join(f"{row.get(t, 0):.2f}" for t in counts) + f" | {scaling} |")
    say("")
if streams:
    say("### Streams: pair latency on one stream (1 MiB) and the pipeline\n")
    say(f"cudaStreamGetId: {streams['stream_id_ns']:.1f} ns per call; strata::identify (driver): {streams.get('identify_ns', 0):.1f} ns\n")
    say("| allocator | ns/pair |")
    say("|---|---:|")
    for k, v in streams["pair_latency_1MiB_ns"].items():
        say(f"| {k} | {v:.1f} |")
    say("\n| allocator | streams | total ms | host enqueue ms | alloc ns/pair | host waits |")
    say("|---|---:|---:|---:|---:|---:|")
    for r in streams["pipeline"]:
        say(f"| {r['allocator']} | {r['streams']} | {r['total_ms']:.2f} | {r.get('enqueue_ms', 0):.2f} | {r['alloc_ns_per_pair']:.1f} | "
            f"{r.get('host_waits', '-')} |")
    if "host_waits_total" in streams:
        say("\nHost waits inside stream_ordered over the whole program: "
            + ", ".join(f"{k} {v}" for k, v in streams["host_waits_total"].items()))
    say("")
if pm:
    say("### Pinned and managed memory\n")
    say("| measure | stack | value |")
    say("|---|---|---:|")
    for r in pm["rows"]:
        say(f"| {r['section']} | {r['stack']} | {r['value']:,.2f} {r['unit']} |")
    say("")
if micro:
    say("### Policy micro-benchmarks (bench/policies_host, simulated memory: bookkeeping only)\n")
    say("| benchmark | ns per iteration (real) | items/s |")
    say("|---|---:|---:|")
    for b in micro.get("benchmarks", []):
        unit = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}.get(b.get("time_unit", "ns"), 1)
        ips = f"{b['items_per_second']:,.0f}" if "items_per_second" in b else ""
        say(f"| {b['name']} | {b['real_time'] * unit:,.1f} | {ips} |")
    say("")
examples = text("examples.log", "")
if examples:
    say("### Examples' own output (their timings)\n")
    say("```")
    say(examples)
    say("```\n")

open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

# ---- Plots (four at most: the device returns few files) ------------------------------------------------------
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib not found: no plots")
    sys.exit(0)


def finite(v):
    return v is not None and not (isinstance(v, float) and math.isnan(v))


if peers:
    fig, ax = plt.subplots(figsize=(10, 6))
    for name, row in peers["pair_ns"].items():
        pts = [(s, v) for s, v in zip(peers["pair_sizes"], row) if finite(v)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name,
                linewidth=3 if name == recommended else 2 if name.startswith("strata") else 1.1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes")
    ax.set_ylabel("ns per allocate+free")
    ax.set_title(f"Pair latency by size ({device.split(',')[0]})")
    ax.legend(fontsize=6)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "latency.png"), dpi=120)

    names = [n for n, r in peers["random"].items() if finite(r["uniform"]) and finite(r["log_uniform"])]
    if names:
        fig, ax = plt.subplots(figsize=(9, 0.32 * len(names) + 1.5))
        y = range(len(names))
        ax.barh([i - 0.2 for i in y], [peers["random"][n]["uniform"] for n in names], height=0.4, label="uniform [1 B, 1 MiB]")
        ax.barh([i + 0.2 for i in y], [peers["random"][n]["log_uniform"] for n in names], height=0.4, label="log-uniform [256 B, 64 MiB]")
        ax.set_yticks(list(y), names, fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("ns per operation (log scale)")
        ax.set_title("Random allocations")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "random.png"), dpi=120)

    traces = peers.get("replay", [])
    if traces:
        fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 0.3 * len(traces[0]["results"]) + 2), sharey=True, squeeze=False)
        for ax, tr in zip(axes[0], traces):
            rs = tr["results"]
            ax.barh(range(len(rs)), [0 if r["failed"] else r["ratio"] for r in rs])
            ax.axvline(1.0, color="k", linewidth=0.8)
            ax.set_title(trace_name(tr["trace"]), fontsize=9)
            ax.set_xlabel("peak reserved / peak live")
            ax.set_xlim(0.9, max([1.6] + [r["ratio"] for r in rs if not r["failed"] and r["ratio"] < 5]))
        axes[0][0].set_yticks(range(len(traces[0]["results"])), [r["stack"] for r in traces[0]["results"]], fontsize=7)
        fig.suptitle("Memory held replaying each trace on device memory")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "replay.png"), dpi=120)
if threads:
    fig, ax = plt.subplots(figsize=(8, 5))
    for s in dict.fromkeys(r["stack"] for r in threads["results"]):
        pts = [(r["threads"], r["mops"]) for r in threads["results"] if r["stack"] == s]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("threads")
    ax.set_ylabel("million operations / s")
    ax.set_title("Throughput by threads")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "threads.png"), dpi=120)
print("plots written to", out)
