"""Tabulates bench/replay_all.sh's JSON: peak held / peak live for each stack on each trace and scale, the
worst case per stack, driver calls per 1000 operations for the page-mapped stacks, and how often each stack took
memory from the device per 100 allocations it served."""
import glob
import json
import os
import sys


def pytorch_figures():
    """PyTorch's own max_memory_reserved / max_memory_allocated on each trace's recording run, default and with
    expandable segments: the last column of bench/traces/README.md's table."""
    figures = {}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces", "README.md")) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and cells[0].endswith(".csv.gz`") and "·" in cells[-1]:
                default, expandable = (float(x) for x in cells[-1].split("·"))
                figures[cells[0].strip("`").replace(".csv.gz", "")] = (default, expandable)
    return figures


PYTORCH = pytorch_figures()


def main(folder):
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "replay-*.json"))):
        with open(path) as f:
            data = json.load(f)
        trace = os.path.basename(data["trace"]).replace(".csv.gz", "")
        for r in data["results"]:
            runs.setdefault(r["stack"], {})[(trace, data["scale"])] = r
    traces = sorted({t for stack in runs.values() for (t, _) in stack})
    scales = sorted({s for stack in runs.values() for (_, s) in stack})
    columns = [(t, s) for t in traces for s in scales]
    print("Peak memory held / peak live (lower is better; 1.000 = nothing beyond what the program used).\n")
    print("| stack | " + " | ".join(f"{t} x{s:g}" for t, s in columns) + " | worst |")
    print("|---|" + "---|" * (len(columns) + 1))
    for stack, results in runs.items():
        cells, worst = [], 0.0
        for key in columns:
            r = results.get(key)
            if r is None or r["failed"]:
                cells.append("failed" if r else "")
                continue
            cells.append(f"{r['ratio']:.3f}")
            worst = max(worst, r["ratio"])
        print(f"| {stack} | " + " | ".join(cells) + f" | {worst:.3f} |")
    print("| PyTorch default (recording run, x1.0) | " + " | ".join(
        f"{PYTORCH[t][0]:.3f}" if s == 1.0 and t in PYTORCH else "" for t, s in columns) + " | |")
    print("| PyTorch expandable segments (recording run, x1.0) | " + " | ".join(
        f"{PYTORCH[t][1]:.3f}" if s == 1.0 and t in PYTORCH else "" for t, s in columns) + " | |")
    print("\nDriver calls of the page-mapped stacks per 1000 operations at x1.0 (maps / unmaps / device waits):\n")
    print("| stack | " + " | ".join(traces) + " |")
    print("|---|" + "---|" * len(traces))
    for stack, results in runs.items():
        cells = []
        for t in traces:
            r = results.get((t, 1.0))
            if r is None or "page_calls" not in r:
                cells.append("")
                continue
            c = r["page_calls"]
            ops = max(r["operations"], 1)
            cells.append(f"{c['maps_per_1000_ops']:.1f} / {c['unmaps_per_1000_ops']:.1f} / {1000.0 * c['device_waits'] / ops:.2f}")
        if any(cells):
            print(f"| {stack} | " + " | ".join(cells) + " |")
    print("\nAllocations taken from the device (chunks, or physical allocations for the page-mapped stacks) per 100")
    print("allocations served, and the most over all runs:\n")
    print("| stack | " + " | ".join(f"{t} x{s:g}" for t, s in columns) + " | most |")
    print("|---|" + "---|" * (len(columns) + 1))
    for stack, results in runs.items():
        cells, most = [], None
        for key in columns:
            r = results.get(key)
            if r is None or not r.get("allocations"):
                cells.append("")  # not run, or JSON from before the tool counted allocations
                continue
            if r["failed"]:
                cells.append("failed")
                continue
            percent = 100.0 * r["upstream_allocations"] / r["allocations"]
            cells.append(f"{percent:.2f}")
            most = percent if most is None else max(most, percent)
        print(f"| {stack} | " + " | ".join(cells) + f" | {'' if most is None else f'{most:.2f}'} |")


if __name__ == "__main__":
    main(sys.argv[1])
