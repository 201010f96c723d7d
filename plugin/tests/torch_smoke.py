"""The plug-in inside PyTorch, without the strata_torch package: the C++ side's own end-to-end check.

python3 torch_smoke.py LIBSTRATA_ALLOC LIBSTRATA_TORCH_HOOKS [stack]
Plugs libstrata_alloc.so in as PyTorch's process-wide allocator, wires the hooks with libstrata_torch_hooks.so,
and checks: tensors and a matmul, record_stream holding a block while a side stream still uses it,
empty_cache releasing memory, torch.OutOfMemoryError (and the process going on), the memory fraction, and a
CUDA graph capture through the graph-pool hooks. One PASS/FAIL line per check; exit status = failures.
"""
import ctypes
import json
import sys

import torch

failures = 0


def check(ok, what, detail=""):
    global failures
    failures += 0 if ok else 1
    print(f"{'PASS' if ok else 'FAIL'}: {what}{' — ' + str(detail) if detail != '' else ''}", flush=True)


lib_path, hooks_path = sys.argv[1], sys.argv[2]
stack = sys.argv[3] if len(sys.argv) > 3 else "default"
lib = ctypes.CDLL(lib_path)
lib.strata_last_error.restype = ctypes.c_char_p
lib.strata_memory_stats_json.restype = ctypes.c_size_t
lib.strata_memory_stats_json.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
check(lib.strata_configure(f"stack={stack}".encode()) == 0, "configure", lib.strata_last_error().decode())


def stats(device=0):
    n = lib.strata_memory_stats_json(device, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.strata_memory_stats_json(device, buf, n + 1)
    return json.loads(buf.value.decode())


allocator = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "strata_malloc_or_throw", "strata_free")
torch.cuda.memory.change_current_allocator(allocator)
hooks = ctypes.CDLL(hooks_path)
check(hooks.strata_torch_wire_hooks() == 0, "the eight hooks set on PyTorch's allocator", lib.strata_last_error().decode())

# Tensors and arithmetic.
a = torch.randn(1024, 1024, device="cuda")
b = a @ a
expected = a.cpu() @ a.cpu()
check(torch.allclose(b.cpu(), expected, rtol=1e-3, atol=1e-2), "matmul on strata's memory matches the CPU")
s = stats()
check(s["allocated_bytes.all.current"] >= 2 * 4 * 1024 * 1024 and s["strata.stack"] == stack,
      "memory_stats counts the tensors", s["allocated_bytes.all.current"])

# record_stream: a block freed on the main stream while a side stream still reads it is held back.
side = torch.cuda.Stream()
x = torch.full((1 << 20,), 7.0, device="cuda")
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    torch.cuda._sleep(200_000_000)  # the side stream is busy for a while
    y = x * 2
x.record_stream(side)
x_bytes = x.numel() * 4
del x
held = stats()["strata.held_for_other_streams_bytes"]
check(held == x_bytes, "record_stream: the freed block is held while the side stream uses it", held)
fill = [torch.full((1 << 20,), -1.0, device="cuda") for _ in range(8)]  # would overwrite x if it were reused
torch.cuda.synchronize()
check(bool((y == 14.0).all()), "record_stream: the side stream read its data, not the later tensors'")
del fill
z = torch.empty(16, device="cuda")  # the next allocation gives the held block back
check(stats()["strata.held_for_other_streams_bytes"] == 0, "record_stream: given back once the side stream is done")

# empty_cache → the plug-in's release.
del a, b, y, z
big = [torch.empty(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]
before = stats()["reserved_bytes.all.current"]
del big
torch.cuda.empty_cache()
after = stats()["reserved_bytes.all.current"]
check(before >= 512 << 20 and after < before, "empty_cache releases idle memory", f"{before} -> {after} bytes")

# Out of memory: torch.OutOfMemoryError, and the process goes on.
try:
    torch.empty(1 << 45, dtype=torch.uint8, device="cuda")
    check(False, "out of memory raises torch.OutOfMemoryError", "no exception")
except torch.OutOfMemoryError as e:
    check("strata" in str(e), "out of memory raises torch.OutOfMemoryError", str(e).splitlines()[0][:160])
except RuntimeError as e:
    check(False, "out of memory raises torch.OutOfMemoryError", f"RuntimeError instead: {e}")
t = torch.ones(1 << 20, device="cuda")
check(float(t.sum()) == float(1 << 20), "after out of memory the process keeps working")
check(stats()["num_ooms"] >= 1, "num_ooms counts it", stats()["num_ooms"])

# The memory fraction (torch.cuda.set_per_process_memory_fraction → the hook).
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(0.25)
try:
    torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
    check(False, "a memory fraction of 0.25 refuses 30% of the device", "allocated")
except torch.OutOfMemoryError:
    check(True, "a memory fraction of 0.25 refuses 30% of the device")
torch.cuda.set_per_process_memory_fraction(1.0)
u = torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
check(u.numel() == int(total * 0.3), "fraction 1.0 again: 30% fits")
del u

# A CUDA graph: captured allocations go to a private pool through the graph-pool hooks.
static_in = torch.randn(1 << 16, device="cuda")
graph = torch.cuda.CUDAGraph()
try:
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        static_out = static_in * 2 + 1
    for i in range(3):
        static_in.fill_(float(i))
        graph.replay()
        torch.cuda.synchronize()
        if not bool((static_out == 2 * i + 1).all()):
            break
    check(bool((static_out == 5.0).all()), "CUDA graph: capture and replay through the graph-pool hooks")
    del graph, static_out
except RuntimeError as e:
    msg = str(e)
    check(False, "CUDA graph: capture and replay through the graph-pool hooks", msg.splitlines()[0][:200])
torch.cuda.synchronize()
v = torch.ones(1000, device="cuda")
check(float(v.sum()) == 1000.0, "after the graph the allocator still serves")

print(f"{'ALL PASSED' if failures == 0 else 'FAILED'}: {failures} failed check(s) in torch_smoke.py (stack={stack})")
sys.exit(min(failures, 100))
