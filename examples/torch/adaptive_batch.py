"""Find the largest batch that fits, back off, and keep training: the loop grows the batch until
torch.OutOfMemoryError, then trains on at a safe size. With strata the error is an ordinary exception and
the process carries on.

    python3 examples/torch/adaptive_batch.py [stack=default,limit=8GiB]
"""

import sys

import strata_torch

strata_torch.enable(sys.argv[1] if len(sys.argv) > 1 else "stack=default,limit=8GiB")

import torch  # noqa: E402

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 1024)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)


def train_step(batch):
    x = torch.randn(batch, 1024, device="cuda")
    loss = model(x).square().mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


batch, fits = 256, None
while True:
    try:
        train_step(batch)
        fits = batch
        batch *= 2
    except torch.OutOfMemoryError:
        print(f"batch {batch}: out of memory; {fits} fits")
        break
assert fits is not None, "not even the first batch fit"
optimizer.zero_grad(set_to_none=True)
torch.cuda.empty_cache()

safe = fits // 2   # leave room for the variation a real data set brings
losses = [train_step(safe) for _ in range(20)]
stats = strata_torch.memory_stats()
print(f"trained 20 steps at batch {safe}; loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
      f"out-of-memory errors counted by strata: {stats.get('num_ooms')}")
assert all(map(torch.isfinite, map(torch.tensor, losses)))
assert stats.get("num_ooms", 0) >= 1
print("OK")
