"""strata for one part of a program only: PyTorch's own allocator everywhere else, strata's memory under the
tensors made inside `torch.cuda.use_mem_pool`. Works after CUDA is already in use (unlike enable()).

    python3 examples/torch/scoped_mempool.py [stack=default]
"""

import sys

import torch

import strata_torch

conf = sys.argv[1] if len(sys.argv) > 1 else "stack=default"
torch.manual_seed(0)
weights = torch.randn(2048, 2048, device="cuda")   # PyTorch's caching allocator: CUDA is now initialized
# The first matrix product on a stream makes PyTorch allocate cuBLAS's workspace (32 MiB on Hopper), which it
# then keeps for the life of the process. Made inside the pool, that workspace would be strata's and would
# keep the pool's memory after the pool is gone; one product here puts it on PyTorch's own allocator.
torch.relu(weights @ torch.randn(2048, 256, device="cuda")).sum().item()   # as inside the pool

try:
    strata_torch.enable(conf)
    raise AssertionError("enable() after CUDA started should have been refused")
except RuntimeError as e:
    print(f"enable() now is refused, as it must be: {str(e)[:90]}...")

pool = strata_torch.MemPool(conf)
with torch.cuda.use_mem_pool(pool):
    activations = [torch.relu(weights @ torch.randn(2048, 256, device="cuda")) for _ in range(8)]
inside = strata_torch.memory_stats()
outside = torch.randn(1024, 1024, device="cuda")   # back on PyTorch's own allocator
print(f"inside the pool: strata holds {strata_torch.format_bytes(inside['reserved_bytes.all.current'])}, "
      f"{inside['allocation.all.current']} segment(s) under {len(activations)} tensors")
assert inside["allocated_bytes.all.current"] >= 8 * 2048 * 256 * 4, "the pool's tensors are not strata's"
assert strata_torch.memory_stats()["allocated_bytes.all.current"] == inside["allocated_bytes.all.current"], \
    "a tensor made outside the pool came from strata"

total = sum(float(a.sum()) for a in activations)
assert total > 0
del activations, pool
torch.cuda.synchronize()
torch.cuda.empty_cache()   # PyTorch returns the pool's segments to strata; strata_torch.empty_cache() releases
strata_torch.empty_cache()
after = strata_torch.memory_stats()
print(f"after the pool is gone: strata holds {strata_torch.format_bytes(after['reserved_bytes.all.current'])}")
assert after["allocated_bytes.all.current"] == 0, \
    f"segments of a destroyed pool are still held ({after['allocated_bytes.all.current']} bytes)"
assert after["reserved_bytes.all.current"] < inside["reserved_bytes.all.current"], "strata released nothing"
assert outside.sum().isfinite()
print("OK")
