"""Where the memory above live sits at a stack's peak: reads strata-plan's JSON (`--json FILE`) and prints, for
each trace and stack, each address range of the map at the peak: the live bytes and blocks, the free blocks
between live blocks (holes no request fitted), and the free bytes after the last live block.
    python3 bench/peak_holes.py PLAN.json [PLAN.json ...]"""
import json
import sys

MIB = 1 << 20


def describe(path):
    with open(path) as f:
        plan = json.load(f)
    for trace in plan["traces"]:
        for stack in trace["stacks"]:
            peak = stack.get("peak_map")
            if not peak:
                continue
            print(f"{trace['trace']} {stack['name']}: held/live {stack['ratio']:.3f}, "
                  f"held {stack['peak_reserved'] / MIB:.1f} MiB at operation {peak['at_op']}")
            for segment in peak["snapshot"]["segments"]:
                used = [b for b in segment["blocks"] if not b["free"]]
                if not used:
                    continue
                end = max(b["offset"] + b["size"] for b in used)
                holes = [b for b in segment["blocks"] if b["free"] and b["offset"] + b["size"] <= end]
                print(f"  range of {segment['size'] / MIB:.0f} MiB: {sum(b['size'] for b in used) / MIB:.1f} MiB live in "
                      f"{len(used)} blocks; {len(holes)} free blocks between them, "
                      f"{sum(b['size'] for b in holes) / MIB:.2f} MiB; live blocks end at {end / MIB:.1f} MiB")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        describe(p)
