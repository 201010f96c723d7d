"""strata as PyTorch's allocator in one line: a small regression network trained with it.

    pip install .            # from the repository root: builds libstrata_alloc.so into strata_torch
    python3 examples/torch/train_one_line.py [stack=default]
"""

import sys

import strata_torch

strata_torch.enable(sys.argv[1] if len(sys.argv) > 1 else "stack=default")   # <- the one line, before any CUDA use

import torch  # noqa: E402

torch.manual_seed(0)
true_w = torch.randn(256, 1, device="cuda")
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
losses = []
for step in range(300):
    x = torch.randn(1024, 256, device="cuda")
    loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())

stats = strata_torch.memory_stats()
print(f"trained 300 steps: loss {losses[0]:.3f} -> {losses[-1]:.4f}")
print(strata_torch.memory_summary())
assert losses[-1] < 0.1 * losses[0], "the model did not learn"
assert stats["allocated_bytes.all.peak"] > 0, "strata served nothing: was it enabled before CUDA started?"
assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]
print("OK")
