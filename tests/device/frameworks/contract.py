"""PyTorch's allocator contract, checked the same way under PyTorch's allocator and under strata's backend: the
cap (set_per_process_memory_fraction and PYTORCH_CUDA_ALLOC_CONF caps what the allocator holds), out of memory
(what observers are given, out of memory under a capture, num_ooms), PyTorch's tools (the profiler's memory view,
the GPU trace the sanitizer uses, segment events in the history), the figures (small and large pools, inactive
split, history turned off, pool blocks) and MemPool(allocator=...) with NCCL's allocator. Every check holds
under PyTorch's own allocator (--allocator native), which is what makes it PyTorch's contract.
    python3 tests/device/frameworks/contract.py [--allocator strata|native] [--conf stack=default]
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks, allocator_from_argv  # noqa: E402

ALLOCATOR = allocator_from_argv()
import torch  # noqa: E402

check = Checks(f"contract[{ALLOCATOR}]")
MiB, GiB = 1 << 20, 1 << 30
HERE = os.path.abspath(__file__)


def child(code, env_extra=None, conf=None):
    """Runs `code` in a fresh process under the same allocator (a setting read at CUDA's start needs one); returns
    (exit status, last line of stdout, stderr tail)."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.update(env_extra or {})
    prelude = ("import sys; sys.path.insert(0, %r)\n" % os.path.dirname(HERE) +
               "sys.argv += ['--allocator', %r%s]\n" % (ALLOCATOR, ", '--conf', %r" % conf if conf else "") +
               "from checks import allocator_from_argv; allocator_from_argv()\nimport torch, json\n")
    p = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, env=env, timeout=300)
    lines = p.stdout.strip().splitlines()
    return p.returncode, (lines[-1] if lines else ""), p.stderr.strip()[-800:]


total = torch.cuda.get_device_properties(0).total_memory

# ---- the cap ----------------------------------------------------------------------------------------------
def cap_holds():
    cap = 2 * GiB
    torch.cuda.set_per_process_memory_fraction(cap / total)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    side = torch.cuda.Stream()
    gen = torch.Generator().manual_seed(1)
    live, ooms, served = [], 0, 0
    for i in range(600):
        if live and int(torch.randint(0, 3, (1,), generator=gen)) == 0:
            live.pop(int(torch.randint(0, len(live), (1,), generator=gen)))
            continue
        n = int(torch.randint(1, 192, (1,), generator=gen)) * MiB + int(torch.randint(0, 4096, (1,), generator=gen))
        try:
            t = torch.empty(n, dtype=torch.uint8, device="cuda")
            served += 1
        except torch.OutOfMemoryError:
            ooms += 1
            live.clear()
            continue
        if i % 2 == 0:   # another stream uses it: its memory stays held after the free until that work is done
            with torch.cuda.stream(side):
                torch.cuda._sleep(100_000)
                t.add_(1)
            t.record_stream(side)
        live.append(t)
        check_reserved = torch.cuda.memory_reserved()
        if check_reserved > cap:
            break
    live.clear()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_reserved()
    check("set_per_process_memory_fraction caps what the allocator holds (2 GiB, 600 random calls, side-stream uses)",
          peak <= cap and ooms > 0 and served > 100, f"peak reserved {peak} of cap {cap}; {served} served, {ooms} out of memory")
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()


check.guard("cap", cap_holds)

rc, line, err = child("frac = 1.5 * (1 << 30) / torch.cuda.get_device_properties(0).total_memory\n"
                      "ok = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
                      "try:\n    torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); print('served')\n"
                      "except torch.OutOfMemoryError:\n    print('oom', torch.cuda.max_memory_reserved())\n",
                      {"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:%.6f" % (1.5 * GiB / total)})
check("PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction caps what the allocator holds",
      rc == 0 and line.startswith("oom") and int(line.split()[1]) <= 1.5 * GiB, f"exit {rc}: {line} {err}")
if ALLOCATOR == "strata":
    rc, line, err = child("torch.empty(1, device='cuda'); print('started')",
                          {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"})
    check("PYTORCH_CUDA_ALLOC_CONF: a setting strata cannot honour is refused, naming it",
          rc != 0 and "garbage_collection_threshold" in err, f"exit {rc}: {line} {err}")
    rc, line, err = child("import warnings\nwith warnings.catch_warnings(record=True) as w:\n"
                          "    warnings.simplefilter('always'); torch.empty(1, device='cuda')\n"
                          "print(json.dumps([str(x.message) for x in w]))",
                          {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})
    check("PYTORCH_CUDA_ALLOC_CONF: a setting without effect under strata is warned, with the reason",
          rc == 0 and "max_split_size_mb:128 has no effect under strata" in line, f"exit {rc}: {line} {err}")
    rc, line, err = child("cap = 1 << 30\n"
                          "torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory)\n"
                          "live, ooms = [], 0\n"
                          "for i in range(300):\n"
                          "    n = ((i * 7919) % 97 + 1) << 20\n"
                          "    try:\n        live.append(torch.empty(n, dtype=torch.uint8, device='cuda'))\n"
                          "    except torch.OutOfMemoryError:\n        ooms += 1; live = live[len(live) // 2:]\n"
                          "    if i % 3 == 0 and live: live.pop(0)\n"
                          "print(torch.cuda.max_memory_reserved(), cap, ooms)", conf="stack=coalescing")
    peak, cap, ooms = (int(v) for v in line.split()) if rc == 0 and len(line.split()) == 3 else (1, 0, 0)
    check("stack=coalescing: set_per_process_memory_fraction caps what strata holds", peak <= cap and ooms > 0,
          f"exit {rc}: {line} {err}")


# ---- out of memory ----------------------------------------------------------------------------------------
def oom_observed():
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, allowed, free: seen.append((dev, size, allowed, free)))
    cap = 2 * GiB
    torch.cuda.set_per_process_memory_fraction(cap / total)
    before = torch.cuda.memory_stats().get("num_ooms", 0)
    ask = 3 * GiB
    check.raises("out of memory past the cap is torch.OutOfMemoryError", torch.OutOfMemoryError,
                 lambda: torch.empty(ask, dtype=torch.uint8, device="cuda"))
    allowed = int(cap / total * total)
    check("out-of-memory observers get the request and the allowed maximum, as PyTorch passes them",
          len(seen) == 1 and seen[0][1] == ask and abs(seen[0][2] - allowed) <= 2 * MiB, f"{seen}, allowed {allowed}")
    check("num_ooms counts the failure the caller saw, once",
          torch.cuda.memory_stats()["num_ooms"] == before + 1, f"{before} -> {torch.cuda.memory_stats()['num_ooms']}")
    torch.cuda.set_per_process_memory_fraction(1.0)


check.guard("oom", oom_observed)

rc, line, err = child("torch.cuda.set_per_process_memory_fraction(2 * (1 << 30) / torch.cuda.get_device_properties(0).total_memory)\n"
                      "x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize()\n"
                      "g = torch.cuda.CUDAGraph()\n"
                      "try:\n"
                      "    with torch.cuda.graph(g):\n"
                      "        y = x * 2\n"
                      "        z = torch.empty(3 << 30, dtype=torch.uint8, device='cuda')\n"
                      "    print('served')\n"
                      "except torch.OutOfMemoryError:\n    print('OutOfMemoryError')\n"
                      "except Exception as e:\n    print(type(e).__name__, str(e)[:200].replace(chr(10), ' '))\n")
check("out of memory during a graph capture is torch.OutOfMemoryError", rc == 0 and line == "OutOfMemoryError",
      f"exit {rc}: {line} {err}")


# ---- PyTorch's tools --------------------------------------------------------------------------------------
def profiler_sees_memory():
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
        x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        del x
    usage = 0
    for e in prof.key_averages():
        usage += abs(getattr(e, "device_memory_usage", 0) or getattr(e, "cuda_memory_usage", 0) or 0)
        usage += abs(getattr(e, "self_device_memory_usage", 0) or 0)
    check("torch.profiler.profile(profile_memory=True) shows CUDA memory", usage >= 64 * MiB, f"{usage} bytes")


check.guard("profiler", profiler_sees_memory)


def gpu_trace_sees_allocations():
    from torch.cuda import _gpu_trace
    allocs, frees = [], []
    torch._C._activate_gpu_trace()
    _gpu_trace.register_callback_for_memory_allocation(allocs.append)
    _gpu_trace.register_callback_for_memory_deallocation(frees.append)
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
    p = x.data_ptr()
    del x
    check("the GPU trace (torch.cuda._sanitizer's) sees allocations and frees", p in allocs and p in frees,
          f"{len(allocs)} allocations, {len(frees)} frees seen")


check.guard("gpu trace", gpu_trace_sees_allocations)


def history_segments_and_clearing():
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(max_entries=10000)
    x = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    del x
    torch.cuda.empty_cache()
    actions = [e["action"] for e in torch.cuda.memory._snapshot()["device_traces"][0]]
    check("the history reports segments taken and given back (SEGMENT_* trace events)",
          any(a in ("segment_alloc", "segment_map") for a in actions) and any(a in ("segment_free", "segment_unmap") for a in actions),
          str(sorted(set(actions))))
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.memory._record_memory_history(max_entries=10000)
    kept = torch.cuda.memory._snapshot()["device_traces"][0]
    check("turning the history off clears it", len(kept) == 0, f"{len(kept)} entries kept")
    torch.cuda.memory._record_memory_history(enabled=None)


check.guard("history", history_segments_and_clearing)


# ---- figures ----------------------------------------------------------------------------------------------
def figures():
    torch.cuda.empty_cache()
    small = [torch.empty(4096, dtype=torch.uint8, device="cuda") for _ in range(64)]
    large = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    t = torch.cuda.memory_stats()
    for key in ("reserved_bytes", "segment", "inactive_split_bytes", "allocated_bytes"):
        s, l, a = t[f"{key}.small_pool.current"], t[f"{key}.large_pool.current"], t[f"{key}.all.current"]
        check(f"{key}: small + large pool = all", s + l == a, f"{s} + {l} vs {a}")
    check("reserved_bytes.small_pool and large_pool are filled", t["reserved_bytes.small_pool.current"] > 0 and
          t["reserved_bytes.large_pool.current"] >= 256 * MiB, json.dumps({k: t[k] for k in t if k.startswith("reserved_bytes")}))
    del large
    t = torch.cuda.memory_stats()
    reserved_before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    releasable = reserved_before - torch.cuda.memory_reserved()
    check("inactive_split leaves out what empty_cache hands back",
          t["inactive_split_bytes.all.current"] <= reserved_before - t["allocated_bytes.all.current"] - releasable,
          f"inactive split {t['inactive_split_bytes.all.current']}, reserved {reserved_before}, allocated "
          f"{t['allocated_bytes.all.current']}, released {releasable}")
    del small
    base = torch.cuda.memory_allocated()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        y = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        del y
    check("a MemPool's freed block is not counted as allocated", torch.cuda.memory_allocated() == base,
          f"{torch.cuda.memory_allocated()} vs {base}")
    del pool


check.guard("figures", figures)


# ---- empty_cache gives the device its memory back -----------------------------------------------------------
def empty_cache_returns_memory():
    """After blocks and temporaries far larger than anything before them are freed, empty_cache hands the device
    back every byte they took: cudaMemGetInfo's free figure returns to where it was (PyTorch's allocator
    cudaFrees every unused segment)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.arange(1 << 16, device=dev, dtype=torch.float32)
    _ = bool(torch.equal(x, x + 1))   # the kernels below, loaded before the first reading
    del x, _
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free0 = torch.cuda.mem_get_info(dev)[0]
    small = torch.full((2 * MiB,), 7.0, device=dev)
    big = torch.arange(75 * MiB, device=dev, dtype=torch.float32)
    same = bool(torch.equal(big, torch.arange(75 * MiB, device=dev, dtype=torch.float32) + 1))
    del small, big
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free1 = torch.cuda.mem_get_info(dev)[0]
    check("empty_cache gives back every byte of blocks and temporaries freed (cudaMemGetInfo's free figure)",
          not same and free1 + 64 * MiB >= free0,
          f"free {free0} before, {free1} after; reserved {torch.cuda.memory_reserved()}")


check.guard("empty_cache", empty_cache_returns_memory)
if ALLOCATOR == "strata":
    rc, line, err = child("x = torch.empty(100 << 20, dtype=torch.uint8, device='cuda'); del x; torch.cuda.empty_cache()\n"
                          "s = torch.cuda.memory_stats(); print(s['num_device_alloc'], s['num_device_free'])",
                          conf="stack=coalescing")
    check("num_device_alloc and num_device_free are counted under stack=coalescing",
          rc == 0 and all(int(v) >= 1 for v in line.split()), f"exit {rc}: {line} {err}")


# ---- MemPool with another allocator: NCCL's -----------------------------------------------------------------
rc, line, err = child("import torch.distributed as dist\n"
                      "dist.init_process_group('nccl', init_method='tcp://127.0.0.1:29533', rank=0, world_size=1)\n"
                      "backend = dist.group.WORLD._get_backend(torch.device('cuda'))\n"
                      "pool = torch.cuda.MemPool(backend.mem_allocator)\n"
                      "with torch.cuda.use_mem_pool(pool):\n"
                      "    t = torch.ones(1 << 20, device='cuda')\n"
                      "dist.all_reduce(t); torch.cuda.synchronize()\n"
                      "print(float(t.sum()), pool.use_count())\n"
                      "del t, pool\ndist.destroy_process_group()\n", {"TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "1"})
NCCL_POOL = "MemPool(allocator=NCCL's mem_allocator) serves tensors that NCCL reduces"
if "mem allocator is not supported in this NCCL version" in err:   # PyTorch's own refusal, under either allocator
    check.skip(NCCL_POOL, "this PyTorch's NCCL has no mem allocator (ProcessGroupNCCL says so)")
else:
    check(NCCL_POOL, rc == 0 and line.startswith(str(float(1 << 20))), f"exit {rc}: {line} {err}")

check.finish()
