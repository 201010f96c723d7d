#!/usr/bin/env python3
"""default_pool against PyTorch's caching allocator on each replayed trace: time per operation, held / live,
and the time the device calls each made, priced with the same machine's bench/vmm_costs figures.

    python3 bench/driver_time.py PEERS_JSON VMM_COSTS_JSON [--markdown FILE] [--stack NAME]

PEERS_JSON is `bench/peers --parts replay --json`, whose replays carry each allocator's device calls: strata's
page-mapped stacks count creates, maps, access calls, unmaps, releases and device waits; PyTorch's allocator
its num_device_alloc / num_device_free (cudaMalloc / cudaFree; with expandable segments, ranges mapped and
unmapped). A kind of call is priced at the median of vmm_costs' rows for it over the sizes it measured (the
driver charges per call more than per byte), a device wait at an idle device's synchronize: the replay runs no
kernels, so that is what its waits cost there. In a real program a wait costs until the device drains.

The verdict per trace, for the stack named by --stack (default_pool) against PyTorch's caching allocator:
time per operation at most PyTorch's (the median of the rounds), held / live at most 1.05 and below expandable
segments', and driver time per operation at most PyTorch's; a trace whose PyTorch row carries no device calls
(a shim built before it counted them) misses the last. Exit status 3 if any trace misses one (1 or 2: the
figures could not be read).
"""

import argparse
import json
import os
import statistics
import sys

TORCH = "torch caching allocator (legacy stream)"
EXPANDABLE = "torch expandable segments (legacy stream)"


def prices(vmm):
    """Microseconds per call, by kind of call."""
    rows = {r["what"]: r["us"] for r in vmm["rows"]}

    def median_of(prefix, exclude=()):
        values = [us for what, us in rows.items() if what.startswith(prefix) and not any(x in what for x in exclude) and us > 0]
        if not values:
            raise SystemExit(f"{prefix!r}: no such row in the vmm_costs figures (rebuild and rerun bench/vmm_costs)")
        return statistics.median(values)

    p = {
        "creates": median_of("cuMemCreate ", exclude=("in a row",)),
        "releases": median_of("cuMemRelease "),
        "maps": median_of("cuMemMap whole "),
        "access_calls": median_of("cuMemSetAccess whole "),
        "unmaps": median_of("cuMemUnmap whole "),
        "device_waits": median_of("cudaDeviceSynchronize"),
        "reserves": 0.0,
        "cudaMalloc": median_of("cudaMalloc "),
        "cudaFree": median_of("cudaFree "),
    }
    # PyTorch's expandable segments count one device allocation per range they map (create, map and access
    # per page of it) and one free per range unmapped: priced as one page each, a lower bound.
    p["expandable_alloc"] = p["creates"] + p["maps"] + p["access_calls"]
    p["expandable_free"] = p["unmaps"] + p["releases"]
    return p


def driver_ns_per_op(result, price):
    """Nanoseconds of device calls per operation of the replay, or None where the allocator counts none."""
    calls = result.get("device_calls") or {}
    if not calls or not result.get("operations"):
        return None
    if "device_allocs" in calls:
        expandable = result["stack"].startswith("torch expandable")
        a, f = ("expandable_alloc", "expandable_free") if expandable else ("cudaMalloc", "cudaFree")
        us = calls["device_allocs"] * price[a] + calls["device_frees"] * price[f]
    else:
        us = sum(n * price[kind] for kind, n in calls.items() if kind in price)
    return us * 1000.0 / result["operations"]


def measured_ns_per_op(result):
    """Nanoseconds per operation the allocator's device calls took, where they were timed (us_* entries)."""
    timed = [v for k, v in (result.get("device_calls") or {}).items() if k.startswith("us_")]
    return sum(timed) * 1000.0 / result["operations"] if timed and result.get("operations") else None


def spread(result):
    rounds = [v for v in result.get("ns_per_op_rounds", []) if v is not None]
    return f"{min(rounds):,.0f}–{max(rounds):,.0f}" if rounds else "–"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("peers")
    ap.add_argument("vmm_costs")
    ap.add_argument("--markdown")
    ap.add_argument("--stack", default="strata default_pool")
    args = ap.parse_args()
    with open(args.peers) as f:
        peers = json.load(f)
    with open(args.vmm_costs) as f:
        price = prices(json.load(f))
    lines = [f"Device: {peers.get('device', '?')}; {peers.get('torch', '')}. ns per operation, the median of the rounds "
             "(their range); driver ns per operation priced with the same machine's vmm_costs.", "",
             "| trace | stack | ns/op (rounds) | held / live | driver ns/op: priced (timed) | device calls |", "|---|---|---|---|---|---|"]
    misses = []
    for replay in peers.get("replay", []):
        trace = os.path.basename(replay["trace"]).split(".")[0]
        by_stack = {r["stack"]: r for r in replay["results"] if not r.get("failed")}
        for r in replay["results"]:
            if r.get("failed"):
                lines.append(f"| {trace} | {r['stack']} | FAILED | | | |")
                continue
            d, m = driver_ns_per_op(r, price), measured_ns_per_op(r)
            calls = ", ".join(f"{k} {v}" for k, v in (r.get("device_calls") or {}).items() if v and not k.startswith("us_"))
            driver = ("–" if d is None else f"{d:,.0f}") + ("" if m is None else f" ({m:,.0f})")
            lines.append(f"| {trace} | {r['stack']} | {r['ns_per_op']:,.0f} ({spread(r)}) | {r['ratio']:.3f} | {driver} | {calls} |")
        mine, torch, expandable = by_stack.get(args.stack), by_stack.get(TORCH), by_stack.get(EXPANDABLE)
        if mine is None or torch is None:
            misses.append(f"{trace}: {args.stack if mine is None else TORCH} did not replay")
            continue
        if mine["ns_per_op"] > torch["ns_per_op"]:
            misses.append(f"{trace}: {mine['ns_per_op']:,.0f} ns/op against PyTorch's {torch['ns_per_op']:,.0f}")
        if mine["ratio"] > 1.05 or (expandable is not None and mine["ratio"] >= expandable["ratio"]):
            misses.append(f"{trace}: held / live {mine['ratio']:.3f}"
                          + (f" (expandable segments {expandable['ratio']:.3f})" if expandable else ""))
        mine_d, torch_d = driver_ns_per_op(mine, price), driver_ns_per_op(torch, price)
        if torch_d is None:
            misses.append(f"{trace}: PyTorch's device calls were not counted (bench/get_torch_shim.sh builds a shim that counts them)")
        elif mine_d is not None and mine_d > torch_d:
            misses.append(f"{trace}: driver {mine_d:,.0f} ns/op against PyTorch's {torch_d:,.0f}")
    lines += ["", f"Prices (µs per call): " + ", ".join(f"{k} {v:.2f}" for k, v in price.items()), ""]
    lines += [f"{args.stack} against {TORCH}: " + ("every target met" if not misses else f"{len(misses)} missed")]
    lines += [f"- {m}" for m in misses]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 3 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
