"""PyTorch's private-pool contract, under strata's backend and under PyTorch's own allocator (same checks):
- a MemPool's freed block recorded on a side stream is not handed to the next allocation while that stream
  still writes it (the side stream sleeps, then fills 1; the new tensor fills 2 and must read 2, every trial);
- a pool reuses its own frees on the same stream (the rule above refuses only what is unsafe);
- a block allocated on one stream of a multi-stream capture is not handed to another stream of it;
- torch.cuda.empty_cache() inside a graph capture raises nothing and the graph replays;
- a MemPool's destructor (emptyCache of its id) raises nothing and leaves the default pool's cache alone.
    python3 tests/device/torch/pool_contract.py [--allocator strata|native] [--conf stack=default] [--trials 20]
Prints PASS/FAIL per check; exits non-zero on any FAIL.
"""

import gc
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "frameworks"))
from checks import Checks, allocator_from_argv  # noqa: E402

allocator = allocator_from_argv()
import torch  # noqa: E402

check = Checks(f"pool_contract[{allocator}]")
MiB = 1 << 20
args = sys.argv[1:]
trials = int(args[args.index("--trials") + 1]) if "--trials" in args else 20
floats = 64 * MiB // 4
sleep_cycles = 20_000_000

if allocator == "strata":
    import strata_torch

    check("the strata backend is in use", strata_torch.backend() == "strata", strata_torch.backend())


def race_trials():
    """The scenario of a block recorded on a side stream, freed, and the same size allocated at once."""
    pool = torch.cuda.MemPool()
    side = torch.cuda.Stream()
    good = 0
    for _ in range(trials):
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(floats, device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.cuda._sleep(sleep_cycles)
                a.fill_(1)
            a.record_stream(side)
            del a
            b = torch.empty(floats, device="cuda")
            b.fill_(2)
        torch.cuda.synchronize()
        good += int(bool((b == 2).all().item()))
        del b
    check(f"MemPool + record_stream: the new tensor reads 2 in every trial ({good} of {trials})", good == trials,
          f"{good} of {trials}")
    del pool
    gc.collect()


def same_stream_reuse():
    """Freed and allocated again on one stream inside a pool: the pool hands the same block back."""
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(floats, device="cuda")
        first = a.data_ptr()
        a.fill_(3)
        del a
        b = torch.empty(floats, device="cuda")
        again = b.data_ptr()
        b.fill_(4)
    torch.cuda.synchronize()
    check("a pool reuses its own free on the same stream", again == first, f"{again:#x} vs {first:#x}")
    check("the reused block holds what the new owner wrote", bool((b == 4).all().item()))
    del b, pool
    gc.collect()


def multi_stream_capture():
    """A capture over two streams: the side stream's freed block is not given to the capturing stream."""
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    x = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            t = x * 5
            side_ptr = t.data_ptr()
            t.add_(1)
            out_side = t.sum()
            del t
        main.wait_stream(side)
        u = torch.empty(1 << 20, device="cuda")
        main_ptr = u.data_ptr()
        u.copy_(x * 7)
        out_main = u.sum()
    g.replay()
    torch.cuda.synchronize()
    check("a multi-stream capture does not hand the side stream's block to the capturing stream",
          main_ptr != side_ptr, f"{main_ptr:#x} vs {side_ptr:#x}")
    check("the multi-stream graph computes what it captured",
          out_side.item() == 6 * (1 << 20) and out_main.item() == 7 * (1 << 20), f"{out_side.item()}, {out_main.item()}")
    del g
    gc.collect()


def empty_cache_in_capture():
    g = torch.cuda.CUDAGraph()
    x = torch.zeros(1 << 16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture, as PyTorch's docs ask
        _ = (x * 2) + 1
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    raised = None
    with torch.cuda.graph(g):
        y = x * 2
        try:
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 (what came is the failure's detail)
            raised = e
        z = y + 1
    check("torch.cuda.empty_cache() inside a graph capture raises nothing", raised is None, repr(raised))
    x.fill_(3)
    g.replay()
    torch.cuda.synchronize()
    check("the graph captured around empty_cache replays", bool((z == 7).all().item()), str(z[:4].tolist()))
    del g, y, z
    gc.collect()
    big = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del big
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    check("empty_cache outside a capture still releases idle memory", after < before, f"{before} -> {after}")


def mempool_destructor():
    keep = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
    del keep  # cached in the default pool
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    raised = None
    try:
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            t = torch.ones(32 * MiB // 4, device="cuda")
        del t
        del pool  # releasePool, then emptyCache(pool id)
        gc.collect()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        raised = e
    check("a MemPool's destructor (emptyCache of its id) raises nothing", raised is None, repr(raised))
    check("emptyCache of a pool's id leaves the default pool's cache", torch.cuda.memory_reserved() >= reserved,
          f"{reserved} -> {torch.cuda.memory_reserved()}")


for name, fn in [("race", race_trials), ("reuse", same_stream_reuse), ("multi-stream capture", multi_stream_capture),
                 ("empty_cache in capture", empty_cache_in_capture), ("MemPool destructor", mempool_destructor)]:
    check.guard(name, fn)
check.finish()
