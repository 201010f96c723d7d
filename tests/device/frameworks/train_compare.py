"""Trains a small transformer and prints its losses as one JSON line ("LOSSES [...]"), under PyTorch's allocator
or strata's backend, so the runner compares the two. Modes:
  eager        plain training
  graph        torch.cuda.graph capture of a whole training step, replayed (a private pool), plus a
               torch.cuda.MemPool used through use_mem_pool
  compile      torch.compile (default mode)
  compile-ro   torch.compile(mode="reduce-overhead"): CUDA graph trees, whose pool checkpoints strata serves
  checkpoint   activation checkpointing (torch.utils.checkpoint)
    python3 tests/device/frameworks/train_compare.py --allocator strata|native --mode MODE [--steps N]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import allocator_from_argv  # noqa: E402

allocator = allocator_from_argv()
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

args = sys.argv[1:]
mode = args[args.index("--mode") + 1]
steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 12
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
VOCAB, D, SEQ, BATCH = 512, 128, 64, 8


class Model(nn.Module):
    def __init__(self, checkpointed=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(D, 4, 4 * D, dropout=0.0, batch_first=True) for _ in range(2))
        self.head = nn.Linear(D, VOCAB)
        self.checkpointed = checkpointed

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = checkpoint(layer, h, use_reentrant=False) if self.checkpointed else layer(h)
        return self.head(h)


model = Model(checkpointed=mode == "checkpoint").cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = nn.CrossEntropyLoss()
gen = torch.Generator(device="cpu").manual_seed(1)
batches = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen) for _ in range(steps)]


def step_fn(m, tokens):
    logits = m(tokens[:, :-1])
    loss = loss_fn(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    return loss


losses = []
if mode in ("eager", "checkpoint"):
    for b in batches:
        opt.zero_grad(set_to_none=True)
        losses.append(step_fn(model, b.cuda()).item())
        opt.step()
elif mode in ("compile", "compile-ro"):
    compiled = torch.compile(model, mode="reduce-overhead" if mode == "compile-ro" else None)
    for b in batches:
        opt.zero_grad(set_to_none=True)
        losses.append(step_fn(compiled, b.cuda()).item())
        opt.step()
elif mode == "graph":
    static_tokens = batches[0].cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up outside the capture, as PyTorch's recipe says
        for _ in range(2):
            opt.zero_grad(set_to_none=False)
            step_fn(model, static_tokens)
    torch.cuda.current_stream().wait_stream(side)
    # Warm-up moved the weights: start from the same weights as the other runs.
    torch.manual_seed(0)
    fresh = Model().cuda()
    model.load_state_dict(fresh.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt.zero_grad(set_to_none=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step_fn(model, static_tokens)
    for b in batches:
        static_tokens.copy_(b.cuda())
        opt.zero_grad(set_to_none=False)
        graph.replay()
        losses.append(static_loss.item())
        opt.step()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        pooled = torch.ones(1 << 20, device="cuda")
    extra = {"mempool_use_count": pool.use_count(), "pooled_sum": float(pooled.sum().item()),
             "mempool_segments": len(pool.snapshot())}
    del pooled
    print("EXTRA " + json.dumps(extra))
else:
    raise SystemExit(f"unknown mode {mode}")
torch.cuda.synchronize()
print("PEAK " + json.dumps({"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}))
print("LOSSES " + json.dumps(losses), flush=True)
