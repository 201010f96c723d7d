#!/usr/bin/env python3
"""Reads the JSON that bench/run_all.sh collected and writes summary.md (tables, targets met or missed) and
PNG plots: latency by size per allocator, throughput by threads, peak reserved / peak live per stack."""
import json
import os
import sys

out = sys.argv[1]


def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None


peers, threads, streams, pm, replay = (load(n) for n in ("peers.json", "threads.json", "streams.json", "pinned_managed.json", "replay.json"))
lines = []
say = lines.append
device = open(os.path.join(out, "device.txt")).read().strip() if os.path.exists(os.path.join(out, "device.txt")) else "?"
commit = os.environ.get("STRATA_COMMIT") or (open(os.path.join(out, "commit.txt")).read().strip() if os.path.exists(os.path.join(out, "commit.txt")) else "?")
say(f"Device: {device}; commit {commit}\n")


def verdict(ok):
    return "met" if ok else "**missed**"


def size_name(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


if peers:
    sizes = peers["pair_sizes"]
    say("### Pair latency (ns per allocate+free)\n")
    say("| allocator | " + " | ".join(size_name(s) for s in sizes) + " |")
    say("|---|" + "---:|" * len(sizes))
    for name, row in peers["pair_ns"].items():
        say(f"| {name} | " + " | ".join(f"{v:,.1f}" for v in row) + " |")
    thrust = peers["pair_ns"].get("thrust disjoint_unsynchronized_pool")
    sc = peers["pair_ns"].get("strata size_class_pool")
    co = peers["pair_ns"].get("strata coalescing_pool")
    if thrust and sc and co:
        small = [i for i, s in enumerate(sizes) if s <= 1 << 20]  # Thrust's pool caches up to 1 MiB blocks
        r_sc = min(thrust[i] / sc[i] for i in small)
        r_co = max(co[i] / thrust[i] for i in small)
        say(f"\nsize_class_pool vs Thrust's pool, sizes up to 1 MiB: at least {r_sc:.2f}x faster (target 2x: {verdict(r_sc >= 2)}); "
            f"coalescing_pool at most {r_co:.2f}x Thrust's time (target within 2x: {verdict(r_co <= 2)})\n")
    say("### Random allocations (ns per operation)\n")
    say("| allocator | uniform [1 B, 1 MiB] | log-uniform [256 B, 64 MiB] |")
    say("|---|---:|---:|")
    for name, r in peers["random"].items():
        say(f"| {name} | {r['uniform']:,.1f} | {r['log_uniform']:,.1f} |")
    ours = {k: v for k, v in peers["random"].items() if k.startswith("strata")}
    theirs = {k: v for k, v in peers["random"].items() if not k.startswith("strata")}
    for dist in ("uniform", "log_uniform"):
        best = min(ours.items(), key=lambda kv: kv[1][dist])
        peer = min(theirs.items(), key=lambda kv: kv[1][dist])
        ratio = peer[1][dist] / best[1][dist]
        say(f"- {dist}: best strata stack {best[0]} {best[1][dist]:.1f} ns vs fastest peer {peer[0]} {peer[1][dist]:.1f} ns: "
            f"{ratio:.2f}x (target 4x: {verdict(ratio >= 4)})")
        rmm = {k: v for k, v in theirs.items() if k.startswith("rmm")}
        if rmm:
            r_best = min(rmm.items(), key=lambda kv: kv[1][dist])
            rr = r_best[1][dist] / best[1][dist]
            say(f"  - vs RMM ({r_best[0]}): {rr:.2f}x (target 3x: {verdict(rr >= 3)})")
    if not any(k.startswith("rmm") for k in peers["random"]):
        say("- RMM: absent in this run (no shim), rows skipped")
    say("")
    if "replay" in peers:
        say(f"### Replay of {os.path.basename(peers['replay']['trace'])} on device memory\n")
        say("| stack | ns/op | peak live MiB | peak reserved MiB | reserved / live |")
        say("|---|---:|---:|---:|---:|")
        for r in peers["replay"]["results"]:
            say(f"| {r['stack']} | {r['ns_per_op']:.1f} | {r['peak_live'] / 2**20:,.0f} | {r['peak_reserved'] / 2**20:,.0f} | {r['ratio']:.3f} |")
        co = [r for r in peers["replay"]["results"] if r["stack"] == "strata coalescing_pool"]
        if co:
            say(f"\ncoalescing_pool peak reserved / peak live {co[0]['ratio']:.3f} (target 1.05: {verdict(co[0]['ratio'] <= 1.05)})\n")
if replay:
    say(f"### Replay on simulated memory ({os.path.basename(replay['trace'])})\n")
    say("| stack | ns/op | reserved / live |")
    say("|---|---:|---:|")
    for r in replay["results"]:
        say(f"| {r['stack']} | {r['ns_per_op']:.1f} | {r['ratio']:.3f} |")
    say("")
if threads:
    say(f"### Threads ({threads['memory']} memory), million operations per second\n")
    stacks = sorted({r["stack"] for r in threads["results"]}, key=lambda s: [r["stack"] for r in threads["results"]].index(s))
    counts = sorted({r["threads"] for r in threads["results"]})
    say("| stack | " + " | ".join(f"{t} thr" for t in counts) + " | scaling at 16 |")
    say("|---|" + "---:|" * (len(counts) + 1))
    for s in stacks:
        row = {r["threads"]: r["mops"] for r in threads["results"] if r["stack"] == s}
        say(f"| {s} | " + " | ".join(f"{row.get(t, 0):.2f}" for t in counts) + f" | {row.get(16, 0) / row[1]:.2f}x |")
    say("")
if streams:
    say("### Streams: pair latency on one stream (1 MiB) and the pipeline\n")
    say(f"cudaStreamGetId: {streams['stream_id_ns']:.1f} ns per call; strata::identify (driver): {streams.get('identify_ns', 0):.1f} ns\n")
    say("| allocator | ns/pair |")
    say("|---|---:|")
    for k, v in streams["pair_latency_1MiB_ns"].items():
        say(f"| {k} | {v:.1f} |")
    say("\n| allocator | streams | total ms | host enqueue ms | alloc ns/pair |")
    say("|---|---:|---:|---:|---:|")
    for r in streams["pipeline"]:
        say(f"| {r['allocator']} | {r['streams']} | {r['total_ms']:.2f} | {r.get('enqueue_ms', 0):.2f} | {r['alloc_ns_per_pair']:.1f} |")
    say("")
if pm:
    say("### Pinned and managed memory\n")
    say("| measure | stack | value |")
    say("|---|---|---:|")
    for r in pm["rows"]:
        say(f"| {r['section']} | {r['stack']} | {r['value']:,.2f} {r['unit']} |")
    say("")

open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib not found: no plots")
    sys.exit(0)

if peers:
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name, row in peers["pair_ns"].items():
        ax.plot(peers["pair_sizes"], row, marker="o", label=name, linewidth=2.2 if name.startswith("strata") else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes")
    ax.set_ylabel("ns per allocate+free")
    ax.set_title(f"Pair latency by size ({device.split(',')[0]})")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "latency.png"), dpi=120)
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
bars = []
if peers and "replay" in peers:
    bars += [(r["stack"] + " (device)", r["ratio"]) for r in peers["replay"]["results"] if not r["failed"] and r["ratio"] > 0]
if replay:
    bars += [(r["stack"] + " (simulated)", r["ratio"]) for r in replay["results"] if not r["failed"]]
if bars:
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(bars) + 1.5))
    ax.barh([b[0] for b in bars], [b[1] for b in bars])
    ax.axvline(1.0, color="k", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("peak reserved / peak live (log scale)")
    ax.set_title("Memory held per stack, replaying the trace")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "replay.png"), dpi=120)
print("plots written to", out)
