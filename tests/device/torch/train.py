"""One seeded training run under one allocator; prints one JSON line (the last line of its output).

    python3 train.py --model gpt2 --alloc strata --mode correctness --steps 30

--alloc native | expandable | strata. `expandable` is native with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
which must be in the environment before torch starts: the driver sets it (this script checks it is there).
--mode correctness: deterministic algorithms, a side stream feeding the batches (record_stream), empty_cache()
half-way, then a CUDA-graph-captured evaluation step compared with the same step run eagerly.
--compile: the model goes through torch.compile (default mode) first.
--mode perf: no determinism switches; the peaks of the whole run, and steps/s over windows of --window steps
after --warmup steps (the host synchronizes only at window edges); every batch is made on the host first.
--passes N (perf): the same batches N times over, only the last pass timed, so every shape the timed steps see
was seen before (cuBLAS's and cuDNN's choices for a new shape, and torch.compile's recompilations, fall in the
untimed passes).
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--alloc", choices=("native", "expandable", "strata"), required=True)
    p.add_argument("--mode", choices=("correctness", "perf"), default="correctness")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--conf", default=os.environ.get("STRATA_TEST_CONF", "stack=default"))
    p.add_argument("--compile", action="store_true", help="train torch.compile(model) (default mode)")
    p.add_argument("--passes", type=int, default=1, help="perf: passes over the same batches, the last one timed")
    return p.parse_args()


def main():
    args = parse()
    if args.mode == "correctness":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # before cuBLAS starts
    if args.alloc == "expandable" and "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        sys.exit("--alloc expandable needs PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment")
    if args.alloc == "strata":
        import strata_torch
        strata_torch.enable(args.conf)   # the one line; before anything touches CUDA
    import torch
    sys.path.insert(0, HERE)
    import models

    if args.mode == "correctness":
        # warn_only: an op without a deterministic kernel still runs (and the losses then may differ in the
        # last bits, which the comparison reports), instead of failing the run.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(1234)
    device = torch.device("cuda", 0)
    model, make_batch, loss_fn = models.build(args.model)
    model = model.to(device)
    if args.compile:
        model = torch.compile(model)
    generates = getattr(model, "generates", False)
    if generates and (args.compile or args.mode != "perf"):
        sys.exit(f"{args.model} is a generation loop: --mode perf only, without --compile")
    optimizer = None if generates else torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(99)
    side = torch.cuda.Stream()
    use_side = os.environ.get("STRATA_TEST_SIDE_STREAM", "1") != "0"
    main_stream = torch.cuda.current_stream()

    # --mode perf makes every step's batch on the host before the timed steps (the same batches, drawn in the
    # same order): ResNet-18's host-side randn took most of a step and varied with the machine's other load,
    # which is not what the allocators are compared on. The copies to the device stay in the loop.
    host_batches = ([tuple(t.pin_memory() for t in make_batch(gen, step)) for step in range(args.steps)]
                    if args.mode == "perf" else None)

    def fetch(step):
        """Copy a batch on the side stream; the main stream waits for it and record_stream keeps the
        side-stream allocation alive until the main stream's work with it is done."""
        x, y = host_batches[step] if host_batches else (t.pin_memory() for t in make_batch(gen, step))
        if not use_side:   # diagnosis only (STRATA_TEST_SIDE_STREAM=0): the copy on the main stream
            return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.cuda.stream(side):
            xd, yd = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        main_stream.wait_stream(side)
        xd.record_stream(main_stream)
        yd.record_stream(main_stream)
        return xd, yd

    passes = args.passes if args.mode == "perf" else 1
    total = passes * args.steps
    timed_from = (passes - 1) * args.steps + (args.warmup if passes == 1 else 0)   # the first window's start
    result = {"model": args.model, "alloc": args.alloc, "mode": args.mode, "steps": args.steps, "compile": args.compile,
              "passes": passes}
    if args.alloc == "strata":
        result["conf"] = args.conf
        result["hooks"] = strata_torch.hooks()
    losses, times = [], []
    batch = fetch(0)
    for step in range(total):
        x, y = batch
        if step + 1 < total:
            batch = fetch((step + 1) % args.steps)   # the next batch's copy overlaps this step
        if generates:   # a generation loop: the step is one generate() call, no gradients
            new_tokens = int(host_batches[step % args.steps][1][0])   # read on the host: no device sync
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model.step(x, new_tokens)
        else:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        losses.append(loss.detach().float())
        del x, y, loss
        if args.mode == "correctness" and step == args.steps // 2:
            before = reserved(torch, args.alloc)
            torch.cuda.empty_cache()
            result["empty_cache_reserved"] = [before, reserved(torch, args.alloc)]
        if args.mode == "perf" and step + 1 >= timed_from and (step + 1 - timed_from) % args.window == 0:
            torch.cuda.synchronize()   # only at window edges: in between, the host runs ahead as in training
            times.append(time.perf_counter())
            if args.alloc == "strata" and len(times) == 1:
                calls_at_start = strata_calls()
    torch.cuda.synchronize()
    result["losses"] = [float(v) for v in torch.stack(losses).cpu()]
    result["losses_hex"] = [v.hex() for v in result["losses"]]
    if args.mode == "correctness":
        result["graph"] = graph_step(torch, model, make_batch, loss_fn, device)
    if args.mode == "perf":
        result["steps_per_s"] = [args.window / (b - a) for a, b in zip(times, times[1:])]
        result["steps_per_s_median"] = statistics.median(result["steps_per_s"])
        if args.alloc == "strata":   # what the stack asked of CUDA per timed step (driver calls, waits, events)
            timed_steps = args.window * (len(times) - 1)
            result["strata_calls_per_step"] = {k: (v - calls_at_start[k]) / timed_steps
                                               for k, v in strata_calls().items()}
    result.update(peaks(torch, args.alloc))
    if args.alloc == "strata":
        result["strata_stats"] = {k: v for k, v in strata_torch.memory_stats().items()
                                  if not isinstance(v, (dict, list))}
        result["strata_layout"] = mapped_layout(strata_torch.snapshot())
        print(strata_torch.memory_summary(), file=sys.stderr)
    print(json.dumps(result))


def mapped_layout(snapshot):
    """The physical allocations behind a page-mapped stack at the end of the run, by size (a kernel's speed may
    depend on how its tensors' memory is laid out, not only on the allocator's calls)."""
    sizes = sorted(m["size"] for seg in snapshot.get("segments", []) for m in seg.get("mapped", []))
    mib = 1 << 20
    return {"mappings": len(sizes), "mapped_bytes": sum(sizes),
            "median_mib": sizes[len(sizes) // 2] / mib if sizes else 0,
            "at_least_64_mib": sum(1 for n in sizes if n >= 64 * mib),
            "at_most_8_mib": sum(1 for n in sizes if n <= 8 * mib)}


def strata_calls():
    import strata_torch
    return {k: v for k, v in strata_torch.memory_stats().items() if k.startswith("strata.calls.")}


def reserved(torch, alloc):
    if alloc == "strata":
        import strata_torch
        return strata_torch.memory_stats()["reserved_bytes.all.current"]
    return torch.cuda.memory_reserved()


def peaks(torch, alloc):
    if alloc == "strata":
        import strata_torch
        s = strata_torch.memory_stats()
    else:
        s = torch.cuda.memory_stats()
    return {"peak_reserved": s["reserved_bytes.all.peak"], "peak_allocated": s["allocated_bytes.all.peak"],
            "ratio": s["reserved_bytes.all.peak"] / max(1, s["allocated_bytes.all.peak"])}


def graph_step(torch, model, make_batch, loss_fn, device):
    """Capture one evaluation step in a CUDA graph (its memory comes through the allocator's graph-pool hooks
    under strata), replay it on new batches, and compare with the same step run eagerly."""
    gen = torch.Generator().manual_seed(7)
    model.eval()
    x0, y0 = (t.to(device) for t in make_batch(gen, 0))
    static_x, static_y = x0.clone(), y0.clone()
    autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)  # noqa: E731
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm), torch.no_grad(), autocast():
        for _ in range(3):
            loss_fn(model(static_x), static_y)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), autocast():
        with torch.cuda.graph(graph):
            static_loss = loss_fn(model(static_x), static_y)
    out = []
    for _ in range(3):
        x, y = (t.to(device) for t in make_batch(gen, 0))
        if x.shape != static_x.shape:   # a variable-length model: keep the captured shape
            continue
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        with torch.no_grad(), autocast():
            eager = loss_fn(model(x), y)
        out.append([float(static_loss), float(eager)])
    del graph, static_loss
    torch.cuda.synchronize()
    torch.cuda.empty_cache()   # the graph's pool was released: its memory goes back
    model.train()
    return out


if __name__ == "__main__":
    main()
