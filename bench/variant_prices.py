#!/usr/bin/env python3
"""mapped_pool's design points priced: for each variant of `bench/mapped_variants --json`, the worst held / live
over every trace and size, and on how many traces its driver calls cost at most what PyTorch's caching
allocator's cudaMalloc / cudaFree calls cost on the same trace (the PyTorch-like model of tools/replay, whose
device allocations match PyTorch's own on the recorded traces: bench/traces/expected.json). Calls are priced
as bench/driver_time.py prices them, with one machine's bench/vmm_costs figures.

    python3 bench/variant_prices.py VARIANTS_JSON VMM_COSTS_JSON [--markdown FILE] [--limit 1.05]

The last column counts the traces where a variant holds at most --limit of live at every size and its driver
calls cost at most PyTorch's: the two targets meet only for a variant where that is every trace.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from driver_time import prices  # noqa: E402  (one pricing for both tables)


def driver_ns(calls, operations, price):
    """Nanoseconds of device calls per operation."""
    return sum(n * price[kind] for kind, n in calls.items() if kind in price) * 1000.0 / max(operations, 1)


def torch_ns(model, price):
    return (model["device_allocs"] * price["cudaMalloc"] + model["device_frees"] * price["cudaFree"]) * 1000.0 / max(model["operations"], 1)


def table(variants, price, limit):
    """Markdown lines: a row per variant, then per trace the default's and PyTorch's priced driver time."""
    torch = variants["pytorch_model"]
    traces = list(torch)
    sizes = len(variants["scales"])
    lines = [f"| variant | worst held / live ({len(traces)} traces × {sizes} sizes) | traces held ≤ {limit} at every size | "
             f"traces at or under PyTorch's driver time | traces meeting both |", "|---|---|---|---|---|"]
    both = []
    for v in variants["variants"]:
        cells = v["traces"]
        complete = all(len(cells[t]["held_live"]) == sizes for t in traces)
        lean = {t for t in traces if len(cells[t]["held_live"]) == sizes and max(cells[t]["held_live"]) <= limit}
        cheap = {t for t in traces if driver_ns(cells[t]["device_calls"], cells[t]["operations"], price) <= torch_ns(torch[t], price)}
        both.append(len(lean & cheap) == len(traces))
        worst = f"{max(r for t in traces for r in cells[t]['held_live']):.3f}" if complete else "failed on a trace"
        lines.append(f"| {v['name']} | {worst} | {len(lean)} | {len(cheap)} | {len(lean & cheap)} |")
    lines += ["", "Driver ns per operation, priced, per trace:", "",
              "| trace | " + " | ".join(v["name"] for v in variants["variants"]) + " | PyTorch-like model |",
              "|---|" + "---|" * (len(variants["variants"]) + 1)]
    for t in traces:
        cells = [f"{driver_ns(v['traces'][t]['device_calls'], v['traces'][t]['operations'], price):,.0f}" for v in variants["variants"]]
        lines.append(f"| {t} | " + " | ".join(cells) + f" | {torch_ns(torch[t], price):,.0f} |")
    return lines, any(both)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants")
    ap.add_argument("vmm_costs")
    ap.add_argument("--markdown")
    ap.add_argument("--limit", type=float, default=1.05)
    args = ap.parse_args()
    with open(args.variants) as f:
        variants = json.load(f)
    with open(args.vmm_costs) as f:
        vmm = json.load(f)
    price = prices(vmm)
    lines, any_met = table(variants, price, args.limit)
    head = [f"mapped_pool's variants priced with vmm_costs from {vmm.get('device', '?')}; held / live at sizes "
            + " / ".join(f"x{s:g}" for s in variants["scales"]) + ".", ""]
    tail = ["", "a variant meets both targets" if any_met else "no variant meets both targets"]
    text = "\n".join(head + lines + tail) + "\n"
    print(text, end="")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
