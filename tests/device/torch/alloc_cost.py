"""Host cost of one tensor allocation and free through PyTorch, for one allocator; prints one JSON line.

    python3 alloc_cost.py --alloc strata --conf stack=default
    python3 alloc_cost.py --alloc floor --floor-lib libfloor_alloc.so   # PyTorch's plugged path alone (floor_alloc.cpp)

Three loops of torch.empty + del on the current stream (sizes 4 KiB to 4 MiB, a ring of 64 live tensors):
`alone` (only the main stream ever used), `shared` (after a side stream allocated once and a tensor was
record_stream'd, as tests/device/torch/train.py does every step), `capture_announced` is not measured here.
Each figure is the median of 5 repetitions, in ns per allocate+free pair, Python's own cost included (the
same for every allocator: compare the allocators, not the absolute figure).
"""

import argparse
import json
import os
import statistics
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--alloc", choices=("native", "expandable", "strata", "floor"), required=True)
    p.add_argument("--floor-lib", help="floor_alloc.cpp built as a shared library (--alloc floor)")
    p.add_argument("--conf", default="stack=default")
    p.add_argument("--n", type=int, default=100000)
    args = p.parse_args()
    if args.alloc == "expandable" and "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        sys.exit("--alloc expandable needs PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment")
    if args.alloc == "strata":
        import strata_torch
        strata_torch.enable(args.conf)
    import torch
    if args.alloc == "floor":
        if not args.floor_lib:
            sys.exit("--alloc floor needs --floor-lib (floor_alloc.cpp built as a shared library)")
        plugged = torch.cuda.memory.CUDAPluggableAllocator(args.floor_lib, "floor_malloc", "floor_free")
        torch.cuda.memory.change_current_allocator(plugged)

    sizes = [4096 << (i % 11) for i in range(64)]
    ring = [None] * 64

    def loop(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(n):
            ring[i & 63] = torch.empty(sizes[(i * 7) & 63], dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n * 1e9

    loop(args.n // 10)  # warm: the pool holds the ring's working set
    alone = statistics.median(loop(args.n) for _ in range(5))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    x.record_stream(torch.cuda.current_stream())
    del x
    y = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    y.record_stream(side)
    del y
    shared = statistics.median(loop(args.n) for _ in range(5))
    print(json.dumps({"alloc": args.alloc, "conf": args.conf if args.alloc == "strata" else "",
                      "ns_per_pair_alone": round(alone, 1), "ns_per_pair_shared": round(shared, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
