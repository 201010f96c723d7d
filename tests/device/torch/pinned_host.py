#!/usr/bin/env python3
"""strata's pinned pool as PyTorch's pinned-memory allocator, on the GPU machine, beside PyTorch's own.

    python3 tests/device/torch/pinned_host.py [--scale 0.5] [--json FILE]

Each part runs in a fresh process, once with PyTorch's allocator ("torch") and once after
strata_torch.enable_pinned() ("strata"):
  patterns  torch.empty(n, pin_memory=True) for the three patterns of bench/pinned_host.cu (same sizes):
            held / requested from torch.cuda.host_memory_stats(), and the time to pin them;
  routes    which PyTorch calls reach strata's pool: torch.empty(pin_memory=True), Tensor.pin_memory(),
            DataLoader(pin_memory=True), a non_blocking copy's recorded use, torch.cuda.host_memory_stats(),
            torch._C._host_emptyCache(), a CUDA graph capturing a copy from pinned memory;
  offload   a training loop keeping its fp32 master weights and gradients in pinned memory (non_blocking copies
            on a side stream): the losses must be equal under both allocators.
  budget    strata only, under enable(pinned=True): a tag paused and resumed ten times while pinned tensors come
            and go; the backup is a block of the pinned pool while the tag sleeps, the pool gets it back at the
            resume, and after the first cycle nothing more is pinned (sleep/wake and the pool share one budget).
Prints PASS/FAIL per check and "ALL PASSED" when every check passed; exits 1 otherwise.
"""

import json
import math
import os
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30


def pattern(name, scale):
    """The sizes of bench/pinned_host.cu's patterns (same formulas)."""
    if name == "24x2.0832GiB":
        return [int(2.0832 * GiB)] * round(24 * scale)
    if name == "experts":
        return [(20 * MiB + (i * 7919 % 1000) * 20971) & ~1 for i in range(round(512 * scale))]
    return [int(2.0 ** (12.0 + 19.0 * math.fmod(i * 0.6180339887498949, 1.0))) for i in range(round(256 * scale))]


def host_stat(stats, name):
    """`name`.current from torch.cuda.host_memory_stats(), under either spelling PyTorch uses."""
    for key in (f"{name}.current", f"{name}.all.current"):
        if key in stats:
            return stats[key]
    raise KeyError(f"no {name} key in torch.cuda.host_memory_stats(): {sorted(stats)}")


def host_held(stats):
    return host_stat(stats, "allocated_bytes")


def child_patterns(mode, scale):
    import torch
    if mode == "strata":
        import strata_torch
        strata_torch.enable_pinned()
    torch.cuda.init()
    result = {}
    for name in ("24x2.0832GiB", "experts", "mixed"):
        sizes = pattern(name, scale)
        t0 = time.perf_counter()
        buffers = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in sizes]
        seconds = time.perf_counter() - t0
        held = host_held(torch.cuda.host_memory_stats())
        entry = {"buffers": len(sizes), "requested": sum(sizes), "held": held, "seconds": seconds,
                 "all_pinned": all(b.is_pinned() for b in buffers)}
        if mode == "strata":
            import strata_torch
            entry["strata_pinned"] = strata_torch.pinned_stats().get("pinned", 0)
        del buffers
        torch._C._host_emptyCache()
        result[name] = entry
    return result


def child_routes(mode):
    import torch
    import strata_torch
    strata_torch.enable_pinned()
    torch.cuda.init()
    checks = {}
    stats = strata_torch.pinned_stats

    def blocks():
        return stats().get("blocks", 0)

    a = torch.empty(1000, pin_memory=True)
    checks["torch.empty(pin_memory=True) reaches strata"] = a.is_pinned() and blocks() == 1
    b = torch.randn(1000).pin_memory()
    checks["Tensor.pin_memory() reaches strata"] = b.is_pinned() and blocks() == 2
    from torch.utils.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(torch.randn(64, 10)), batch_size=16, pin_memory=True)
    batch = next(iter(loader))[0]
    checks["DataLoader(pin_memory=True) reaches strata"] = batch.is_pinned() and blocks() >= 3
    del loader
    x = torch.full((4 * MiB,), 3.0, pin_memory=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        y = x.to("cuda", non_blocking=True)
    recorded = stats().get("events_recorded", 0)
    address = x.data_ptr()
    del x  # freed while the copy may still run: an event on `side` guards it
    checks["a non_blocking copy's use is recorded (event at free)"] = stats().get("events_recorded", 0) == recorded + 1
    z = torch.empty(4 * MiB, pin_memory=True)
    checks["a block a copy still reads is not handed out"] = z.data_ptr() != address or side.query()
    side.synchronize()
    checks["the copy read the right values"] = bool((y == 3.0).all().item())
    host = torch.cuda.host_memory_stats()
    checks["torch.cuda.host_memory_stats() reports strata's figures"] = host_held(host) == stats()["pinned"]
    del a, b, batch, z
    before = stats()["pinned"]
    torch._C._host_emptyCache()
    checks["torch._C._host_emptyCache() unpins strata's idle memory"] = stats()["pinned"] < before
    h = torch.arange(1024, dtype=torch.float32).pin_memory()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            d = h.to("cuda", non_blocking=True) * 2
        graph.replay()
        torch.cuda.synchronize()
        checks["a CUDA graph capturing a copy from pinned memory works"] = bool((d == torch.arange(1024, device="cuda") * 2).all().item())
    except Exception as e:  # reported, not raised: the other checks still count
        checks[f"a CUDA graph capturing a copy from pinned memory works ({type(e).__name__}: {e})"] = False
    return {"checks": checks, "stats": stats()}


def child_offload(mode):
    import torch
    if mode == "strata":
        import strata_torch
        strata_torch.enable_pinned()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    master = [p.detach().to("cpu").pin_memory() for p in model.parameters()]
    grads = [torch.empty_like(m).pin_memory() for m in master]
    side = torch.cuda.Stream()
    data = torch.randn(64, 512, device="cuda")
    target = torch.randint(0, 10, (64,), device="cuda")
    losses = []
    t0 = time.perf_counter()
    for step in range(50):
        model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        losses.append(loss.item())
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for g, p in zip(grads, model.parameters()):
                g.copy_(p.grad, non_blocking=True)
        side.synchronize()
        for m, g in zip(master, grads):
            m.add_(g, alpha=-0.05)
        with torch.cuda.stream(side):
            for m, p in zip(master, model.parameters()):
                p.data.copy_(m, non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
        staged = torch.empty(64 * 512, pin_memory=True)  # a pinned buffer per step, freed at once
        del staged
    torch.cuda.synchronize()
    return {"losses": losses, "seconds": time.perf_counter() - t0}


def child_budget():
    """Checks that fail where the backup is pinned apart from the pool: while the tag sleeps the pool's in-use
    bytes hold the backup; after a resume no backup memory is kept outside the pool (release_backup() finds
    none); the pinned tensors of every cycle fit in the pages the backup used, so the pool's pins stop growing
    after the first cycle and it holds about one backup's worth, not the backup plus the tensors."""
    import torch
    import strata_torch
    strata_torch.enable("stack=default", pinned=True)
    stats = strata_torch.pinned_stats
    backup = 64 * MiB
    with strata_torch.tag("trainer"):
        weights = torch.full((backup // 4,), 1.5, device="cuda")
    torch.cuda.synchronize()
    checks = {}
    ok_asleep = ok_host = ok_back = ok_kept = ok_values = True
    pins_after_first = pinned_after_first = None
    for cycle in range(10):
        strata_torch.pause("trainer")
        ok_asleep &= stats().get("in_use", 0) >= backup
        ok_host &= host_stat(torch.cuda.host_memory_stats(), "active_bytes") >= backup
        during = torch.empty(MiB, dtype=torch.uint8, pin_memory=True)  # the pool serves tensors while the tag sleeps
        del during
        strata_torch.resume("trainer")
        ok_back &= stats().get("in_use", 0) == 0
        ok_kept &= strata_torch.release_backup() == 0
        # Offload buffers between cycles: carved from the pages the backup just gave back, freed before the
        # next pause, which finds them merged again.
        staged = [torch.empty(16 * MiB, dtype=torch.uint8, pin_memory=True) for _ in range(3)]
        for buffer in staged:
            buffer.fill_(cycle)
        del staged, buffer
        weights.add_(1.0)
        torch.cuda.synchronize()
        ok_values &= bool((weights == 2.5 + cycle).all().item())
        if cycle == 0:
            pins_after_first, pinned_after_first = stats()["pins"], stats()["pinned"]
    checks["while a tag sleeps its backup is a block of the pinned pool (pinned_stats in_use)"] = ok_asleep
    checks["torch.cuda.host_memory_stats() counts the lent backup as active while the tag sleeps"] = ok_host
    checks["a resume gives the backup back to the pool at once"] = ok_back
    checks["no backup memory is kept pinned outside the pool (release_backup() finds none)"] = ok_kept
    checks["the tag's contents survive every cycle"] = ok_values
    checks["nothing is pinned after the first cycle"] = stats()["pins"] == pins_after_first
    # One backup's worth: the backup (its pages rounded up to one 2 MiB page more at most) and the 1 MiB tensor
    # made while the backup held the pool's pages; the backup and the 48 MiB of offload buffers apart would be
    # 112 MiB or more.
    checks["the pool holds one backup's worth (+1 MiB made while asleep, +2 MiB of rounding), not the backup and "
           "the tensors apart"] = pinned_after_first <= backup + 3 * MiB and stats()["pinned"] == pinned_after_first
    del weights
    try:
        strata_torch.disable_pinned()
        checks["disable_pinned stops the lending, then uninstalls"] = True
    except RuntimeError as e:
        checks[f"disable_pinned stops the lending, then uninstalls ({e})"] = False
    return {"checks": checks, "stats": stats()}


def run_child(*args):
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout)[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    args = sys.argv[1:]
    if args and args[0] == "--child":
        kind, mode = args[1], args[2]
        if kind == "patterns":
            print(json.dumps(child_patterns(mode, float(args[3]))))
        elif kind == "routes":
            print(json.dumps(child_routes(mode)))
        elif kind == "budget":
            print(json.dumps(child_budget()))
        else:
            print(json.dumps(child_offload(mode)))
        return 0
    scale = float(args[args.index("--scale") + 1]) if "--scale" in args else 0.5
    json_path = args[args.index("--json") + 1] if "--json" in args else None
    report = {"scale": scale}
    failed = 0

    def check(name, ok, detail=""):
        nonlocal failed
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}{(': ' + detail) if detail else ''}", flush=True)

    for mode in ("torch", "strata"):
        report[f"patterns_{mode}"] = run_child("patterns", mode, str(scale))
    print(f"\nheld / requested, torch.empty(n, pin_memory=True), scale {scale}")
    print(f"{'pattern':<16} {'buffers':>8} {'GiB asked':>10} {'torch':>8} {'strata':>8} {'torch s':>9} {'strata s':>9}")
    for name in ("24x2.0832GiB", "experts", "mixed"):
        t, s = report["patterns_torch"].get(name), report["patterns_strata"].get(name)
        if t is None or s is None:
            check(f"pattern {name} ran", False, str(report["patterns_torch"].get("error") or report["patterns_strata"].get("error")))
            continue
        print(f"{name:<16} {s['buffers']:>8} {s['requested'] / GiB:>10.2f} {t['held'] / t['requested']:>8.3f} "
              f"{s['held'] / s['requested']:>8.4f} {t['seconds']:>9.2f} {s['seconds']:>9.2f}")
        check(f"strata held / requested <= 1.02 on {name}", s["held"] / s["requested"] <= 1.02,
              f"{s['held'] / s['requested']:.4f} (PyTorch {t['held'] / t['requested']:.3f})")
        check(f"host_memory_stats equals strata's own figure on {name}", s["held"] == s.get("strata_pinned"))
    for part in ("routes", "budget"):
        result = run_child(part, "strata")
        report[part] = result
        if "error" in result:
            check(f"{part} ran", False, result["error"])
        else:
            for name, ok in result["checks"].items():
                check(name, ok)
    offload = {mode: run_child("offload", mode) for mode in ("torch", "strata")}
    report["offload"] = offload
    if any("error" in o for o in offload.values()):
        check("offload ran", False, str([o.get("error") for o in offload.values()]))
    else:
        check("offload training: equal losses under both allocators", offload["torch"]["losses"] == offload["strata"]["losses"])
        check("offload training: strata no slower than 1.1x PyTorch's", offload["strata"]["seconds"] <= 1.1 * offload["torch"]["seconds"],
              f"{offload['strata']['seconds']:.3f} s vs {offload['torch']['seconds']:.3f} s")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    print("ALL PASSED" if failed == 0 else f"{failed} FAILED")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
