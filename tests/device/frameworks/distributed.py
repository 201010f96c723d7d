"""One rank of a two-GPU training run (launched by torchrun from distributed_run.py): GPT-2 small with a sequence
length drawn per step, wrapped in DDP or sharded with FSDP2 (fully_shard per block, then the root), under
PyTorch's allocator or strata's backend. Rank 0 prints one JSON line: the losses, every rank's peak reserved and
allocated bytes (torch.cuda's own figures, which strata's backend serves) and the steps per second after warm-up.
    torchrun --nproc_per_node 2 distributed.py --allocator native|strata --mode ddp|fsdp2 [--steps N]
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "torch"))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic cuBLAS, before it starts
from checks import allocator_from_argv  # noqa: E402

allocator = allocator_from_argv()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import models  # noqa: E402
import train  # noqa: E402  (tests/device/torch/train.py: strata_calls)

args = sys.argv[1:]
mode = args[args.index("--mode") + 1]
steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 24
warmup = 6


def strata_calls():
    """What strata's stack asked of CUDA so far (driver calls, waits, events); empty under PyTorch's allocator."""
    return train.strata_calls() if allocator == "strata" else {}


def wrap(model, rank):
    if mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def main():
    if steps <= warmup:
        sys.exit(f"--steps {steps}: must exceed the {warmup} warm-up steps")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(1234)   # the same initial weights on both ranks
    model, make_batch, loss_fn = models.build("gpt2_varlen")
    model = wrap(model.cuda(), rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(99 + rank)   # each rank its own batches
    batches = [tuple(t.pin_memory() for t in make_batch(gen, s)) for s in range(steps)]
    losses = []
    for step, (x, y) in enumerate(batches):
        if step == warmup:
            torch.cuda.synchronize()
            started, calls_at_start = time.perf_counter(), strata_calls()
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().float())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    mine = torch.tensor([torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()],
                        dtype=torch.float64, device="cuda")
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    if rank == 0:
        print(json.dumps({"allocator": allocator, "mode": mode, "steps": steps,
                          "losses": [float(v) for v in torch.stack(losses).cpu()],
                          "peak_reserved": [int(p[0]) for p in every], "peak_allocated": [int(p[1]) for p in every],
                          "steps_per_s": (steps - warmup) / seconds,
                          "backend": torch.cuda.memory.get_allocator_backend(),
                          "strata_calls_per_step": {k: (v - calls_at_start[k]) / (steps - warmup)
                                                    for k, v in strata_calls().items()}}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
