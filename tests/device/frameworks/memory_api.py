"""Every torch.cuda memory function under strata's backend, each figure compared to the byte with strata's own
statistics (strata_torch.memory_stats, read through libstrata_alloc.so's C entry points), plus the recorded
history: _record_memory_history + _dump_snapshot give a pickle that torch.cuda._memory_viz renders.
    python3 tests/device/frameworks/memory_api.py [--conf stack=default] [--out DIR]
"""

import os
import pickle
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks, allocator_from_argv  # noqa: E402

allocator_from_argv()
import strata_torch  # noqa: E402
import torch  # noqa: E402

check = Checks("memory_api")
MiB = 1 << 20
out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else tempfile.mkdtemp()

check("the strata backend is in use", strata_torch.backend() == "strata", strata_torch.backend())
check("torch.cuda.memory.get_allocator_backend() names strata", torch.cuda.memory.get_allocator_backend() == "strata",
      torch.cuda.memory.get_allocator_backend())


def block(n):
    """The block PyTorch counts for a request of n bytes: a multiple of 512 bytes."""
    return max(512, (n + 511) // 512 * 512)


def agree(label):
    """torch.cuda's figures against strata's own: to the byte where both count the same thing; torch.cuda counts
    each block at PyTorch's size (a multiple of 512 bytes) where strata counts the bytes asked for."""
    torch.cuda.synchronize()
    s = strata_torch.memory_stats()
    t = torch.cuda.memory_stats()
    pairs = [
        ("memory_reserved", torch.cuda.memory_reserved(), s["reserved_bytes.all.current"]),
        ("max_memory_reserved", torch.cuda.max_memory_reserved(), s["reserved_bytes.all.peak"]),
        ("allocation.all.current", t["allocation.all.current"], s["allocation.all.current"]),
        ("segment.all.current", t["segment.all.current"], s["segment.all.current"]),
        ("num_ooms", t["num_ooms"], s["num_ooms"]),
        ("num_alloc_retries", t["num_alloc_retries"], s["num_alloc_retries"]),
    ]
    bad = [(k, a, b) for k, a, b in pairs if a != b]
    check(f"{label}: torch.cuda figures equal strata's ({len(pairs)} figures)", not bad, str(bad))
    rounding = 512 * max(1, t["allocation.all.current"])
    for key in ("allocated_bytes.all.current", "active_bytes.all.current"):
        over = t[key] - s[key]
        check(f"{label}: {key} is strata's rounded up to PyTorch's blocks", 0 <= over < rounding, f"{t[key]} vs {s[key]}")
    small = t["allocated_bytes.small_pool.current"] + t["allocated_bytes.large_pool.current"]
    check(f"{label}: small + large pool = all", small == t["allocated_bytes.all.current"],
          f"{small} vs {t['allocated_bytes.all.current']}")


sizes = [1000, 3 * MiB, 4096, 100 * MiB, 512]
blocks = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
agree("after five allocations")
check("memory_allocated counts each block at PyTorch's size", torch.cuda.memory_allocated() == sum(map(block, sizes)),
      f"{torch.cuda.memory_allocated()} vs {sum(map(block, sizes))}")
check("memory_stats counts small and large blocks apart",
      torch.cuda.memory_stats()["allocation.small_pool.current"] == 3 and
      torch.cuda.memory_stats()["allocation.large_pool.current"] == 2, str(torch.cuda.memory_stats()["allocation.small_pool.current"]))

del blocks[3]
agree("after a free")
check("the peak remembers the freed 100 MiB", torch.cuda.max_memory_allocated() == sum(map(block, sizes)))
torch.cuda.reset_peak_memory_stats()
agree("after reset_peak_memory_stats")
check("reset_peak_memory_stats moves the peak to current", torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated())
torch.cuda.reset_accumulated_memory_stats()
check("reset_accumulated_memory_stats clears the totals", torch.cuda.memory_stats()["allocation.all.allocated"] == 0)

summary = check.guard("memory_summary", torch.cuda.memory_summary)
check("memory_summary renders strata's figures", summary is not None and "Allocated memory" in summary, (summary or "")[:200])

before = torch.cuda.memory_reserved()
torch.cuda.empty_cache()
agree("after empty_cache")
check("empty_cache gives idle memory back", torch.cuda.memory_reserved() < before, f"{before} -> {torch.cuda.memory_reserved()}")

free_b, total_b = torch.cuda.mem_get_info()
check("mem_get_info", 0 < free_b <= total_b)

p = torch.cuda.caching_allocator_alloc(5 * MiB)
check("caching_allocator_alloc (raw_alloc) is counted",
      torch.cuda.memory_allocated() == sum(map(block, sizes)) - 100 * MiB + 5 * MiB)
torch.cuda.caching_allocator_delete(p)
agree("after raw_alloc and raw_delete")

snap = torch.cuda.memory_snapshot()
live = sum(b["size"] for seg in snap for b in seg["blocks"] if b["state"] == "active_allocated")
check("memory_snapshot lists the live blocks", live >= torch.cuda.memory_allocated(), f"{live} vs {torch.cuda.memory_allocated()}")
tiled = all(sum(b["size"] for b in seg["blocks"]) == seg["total_size"] for seg in snap)
check("memory_snapshot's blocks tile their segments", tiled)

side = torch.cuda.Stream()
x = torch.ones(2 * MiB, device="cuda")
with torch.cuda.stream(side):
    y = x * 2
x.record_stream(side)
del x
agree("after record_stream and a free")
torch.cuda.synchronize()
del y

# The cap: set_per_process_memory_fraction reaches strata; out of memory is torch.OutOfMemoryError with
# PyTorch's kind of message and strata's figures, counted in num_ooms on both sides.
torch.cuda.set_per_process_memory_fraction(0.25)
check("get_per_process_memory_fraction", abs(torch.cuda.memory.get_per_process_memory_fraction() - 0.25) < 1e-6,
      str(torch.cuda.memory.get_per_process_memory_fraction()))
observed = []
torch._C._cuda_attach_out_of_memory_observer(lambda *a: observed.append(a))
check.raises("out of memory is torch.OutOfMemoryError", torch.OutOfMemoryError,
             lambda: torch.empty(int(total_b * 0.3), dtype=torch.uint8, device="cuda"),
             must_mention=("CUDA out of memory. Tried to allocate", "strata holds", "cap"))
check("the out-of-memory observer was called", len(observed) == 1, str(observed))
agree("after an out of memory")
check("num_ooms counts it", torch.cuda.memory_stats()["num_ooms"] == 1)
torch.cuda.set_per_process_memory_fraction(1.0)

# History: frames recorded with each allocation; the pickle renders in PyTorch's viewer.
torch.cuda.memory._record_memory_history(max_entries=100000)


def allocate_in_a_named_function():
    return [torch.randn(n, device="cuda") for n in (1 << 10, 1 << 18, 1 << 22)]


kept = allocate_in_a_named_function()
dropped = allocate_in_a_named_function()
del dropped
path = os.path.join(out_dir, "strata_snapshot.pickle")
torch.cuda.memory._dump_snapshot(path)
torch.cuda.memory._record_memory_history(enabled=None)
with open(path, "rb") as f:
    data = pickle.load(f)
trace = data["device_traces"][0]
allocs = [e for e in trace if e["action"] == "alloc"]
frees = [e for e in trace if e["action"] == "free_completed"]
check("the trace has the six allocations and three frees", len(allocs) >= 6 and len(frees) >= 3, f"{len(allocs)} / {len(frees)}")
named = [e for e in allocs if any(fr.get("name") == "allocate_in_a_named_function" for fr in e.get("frames", []))]
check("allocations carry their Python frames", len(named) >= 6, f"{len(named)} of {len(allocs)}")
live_frames = [b for seg in data["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated" and any(fr.get("name") == "allocate_in_a_named_function" for fr in b["frames"])]
check("live blocks carry their frames in the segments", len(live_frames) >= 3, str(len(live_frames)))

from torch.cuda import _memory_viz  # noqa: E402


def folded(lines):
    """The folded stacks themselves: PyTorch's default formatter downloads flamegraph.pl, and the device has no network."""
    return lines


for name, fn in [("segment_plot", lambda: _memory_viz.segment_plot(data)), ("trace_plot", lambda: _memory_viz.trace_plot(data)),
                 ("memory", lambda: _memory_viz.memory(data, format_flamegraph=folded)),
                 ("segments", lambda: _memory_viz.segments(data, format_flamegraph=folded)),
                 ("segsum", lambda: _memory_viz.segsum(data)), ("trace", lambda: _memory_viz.trace(data)),
                 ("compare", lambda: _memory_viz.compare([], data["segments"], format_flamegraph=folded))]:
    result = check.guard(f"_memory_viz.{name}", fn)
    check(f"_memory_viz.{name} renders the strata snapshot", isinstance(result, str) and len(result) > 0,
          type(result).__name__)
del kept
agree("at the end")
check.finish()
