"""strata as CuPy's allocator: arrays on two streams, a reduction checked against NumPy, the statistics.

    python3 examples/cupy/cupy_example.py [stack=default]
"""

import sys

import numpy as np

import strata_torch
import strata_torch.cupy

import cupy as cp

strata_torch.cupy.enable(sys.argv[1] if len(sys.argv) > 1 else "stack=default")

rng = np.random.default_rng(0)
host = rng.standard_normal((2048, 2048)).astype(np.float32)
a = cp.asarray(host)                              # allocated by strata, on the current (default) stream
side = cp.cuda.Stream(non_blocking=True)
with side:                                        # allocations here are ordered on `side`
    b = a @ a.T
    c = cp.tanh(b).sum(axis=1)
side.synchronize()
expected = np.tanh(host.astype(np.float64) @ host.T.astype(np.float64)).sum(axis=1)
assert np.allclose(cp.asnumpy(c), expected, rtol=1e-3, atol=1e-2), "wrong result"

stats = strata_torch.memory_stats(0)
print(strata_torch.memory_summary(0))
assert stats["allocated_bytes.all.current"] >= 2 * host.nbytes, "a and b (and c) are not strata's"
del a, b, c
cp.cuda.Device().synchronize()
held = strata_torch.memory_stats(0)["allocated_bytes.all.current"]   # what CuPy keeps (library workspaces)
assert held < host.nbytes, f"a, b and c were freed, yet {held} bytes are still in use"
for size in (1 << 10, 1 << 20, 1 << 28):          # grow and free: nothing more stays in use
    x = cp.zeros(size, dtype=cp.uint8)
    assert int(x.sum()) == 0
    del x
cp.cuda.Device().synchronize()
assert strata_torch.memory_stats(0)["allocated_bytes.all.current"] == held, "freed arrays still in use"
try:
    cp.empty(1 << 50, dtype=cp.uint8)              # 1 PiB: refused as CuPy's own error, process carries on
    raise AssertionError("a 1 PiB array was allocated")
except cp.cuda.memory.OutOfMemoryError as e:
    print(f"1 PiB refused: {e}")
assert float(cp.arange(10).sum()) == 45.0
print("OK")
