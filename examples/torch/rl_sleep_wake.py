"""An RL-style loop on one GPU: a generator model and a trainer take turns, each putting the other to sleep.

    pip install .            # from the repository root; the example needs transformers (models from configs)
    python3 examples/torch/rl_sleep_wake.py [--iterations 3] [--check]

The trainer (a Llama-style policy and its AdamW state) lives under the tag "trainer", the generator (a copy of
the policy and its KV cache) under "generator". Each iteration: the generator writes rollouts; it is paused
(contents to pinned host memory, device memory given back) and the trainer resumed at its old addresses; the
trainer takes a few steps on the rollouts; its weights are copied to the host, the trainer is paused, the
generator resumed and loaded with the new weights. The device memory in use (cudaMemGetInfo) is printed
between the phases, with each tag's figures.

--check runs the same loop a second time without tags, pause or resume, and requires the losses and the
rollouts to be bitwise equal to the first run's, and every pause to give back at least 99% of the device memory
the tag held. Random weights: nothing is downloaded.
"""

import argparse
import contextlib
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic cuBLAS, before it starts

import strata_torch

strata_torch.enable()   # before anything touches CUDA

import torch  # noqa: E402

MiB = 1 << 20


def build_policy(seed):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=512,
                         attn_implementation="eager")
    return LlamaForCausalLM(config)


def device_used():
    free, total = torch.cuda.mem_get_info()
    return total - free


class Phases:
    """Prints the device memory in use after each phase, and checks what each pause gave back."""

    def __init__(self, sleeping):
        self.sleeping = sleeping
        self.shortfalls = []

    def show(self, what):
        if self.sleeping:
            figures = "  ".join(f"{t}: {strata_torch.tag_stats(t)['physical'] / MiB:7.0f} MiB mapped"
                                f"{' (asleep)' if strata_torch.tag_stats(t)['paused'] else ''}"
                                for t in ("trainer", "generator"))
            print(f"  {what:<34} device in use {device_used() / MiB:8.0f} MiB   {figures}")

    def pause(self, name):
        if not self.sleeping:
            return
        held, before = strata_torch.tag_stats(name)["physical"], device_used()
        strata_torch.pause(name)
        given_back = before - device_used()
        if given_back < 0.99 * held:
            self.shortfalls.append(f"pausing {name} gave back {given_back} of its {held} bytes")
        self.show(f"{name} paused")

    def resume(self, name):
        if self.sleeping:
            strata_torch.resume(name)
            self.show(f"{name} resumed")


def warm_up_outside_tags(device):
    """PyTorch keeps a cuBLAS workspace per thread and stream, allocated through the allocator at the first
    matrix product and never freed: made inside a tag it would belong to that tag and sleep with it while the
    other model's products still use it. One product of each kind here, untagged, makes it tag 0's."""
    x = torch.ones(64, 64, device=device)
    torch.nn.functional.linear(x, x, x[0]).sum().item()
    (x @ x).sum().item()


def tagged(sleeping, name):
    return strata_torch.tag(name) if sleeping else contextlib.nullcontext()


def loop(iterations, sleeping):
    """The RL loop; returns (losses, rollouts, shortfalls), all on the host."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    phases = Phases(sleeping)
    device = torch.device("cuda")
    warm_up_outside_tags(device)
    with tagged(sleeping, "trainer"):
        policy = build_policy(0).to(device)
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    with tagged(sleeping, "generator"):
        generator = build_policy(0).to(device).eval()
    phases.show("both built")
    phases.pause("trainer")
    prompts = torch.randint(3, 4096, (8, 16), generator=torch.Generator().manual_seed(7))
    losses, rollouts = [], []
    for _ in range(iterations):
        with tagged(sleeping, "generator"), torch.no_grad():
            out = generator.generate(prompts.to(device), max_new_tokens=48, do_sample=False, pad_token_id=0)
        rollouts.append(out.cpu())
        del out
        phases.pause("generator")
        phases.resume("trainer")
        with tagged(sleeping, "trainer"):
            policy.train()
            batch = rollouts[-1].to(device)
            for _ in range(4):
                loss = policy(input_ids=batch, labels=batch).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(loss.detach().cpu())
            optimizer.zero_grad(set_to_none=True)   # gradients come from autograd's threads (tag 0): none kept
            del batch, loss
            weights = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
        phases.pause("trainer")
        phases.resume("generator")
        with torch.no_grad():
            generator.load_state_dict(weights)   # copied into the generator's tensors, at their addresses
        del weights
    torch.cuda.synchronize()
    if sleeping:
        phases.resume("trainer")   # the loop ends with both awake, so both can be freed
    del policy, optimizer, generator
    torch.cuda.empty_cache()
    return torch.stack(losses), rollouts, phases.shortfalls


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--check", action="store_true", help="compare with the loop without pause and resume")
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}, strata backend: {strata_torch.backend()}")
    losses, rollouts, shortfalls = loop(args.iterations, sleeping=True)
    print(f"losses: {' '.join(f'{v:.4f}' for v in losses.tolist())}")
    if not args.check:
        print("OK")
        return 0
    plain_losses, plain_rollouts, _ = loop(args.iterations, sleeping=False)
    problems = list(shortfalls)
    if not torch.equal(losses, plain_losses):
        problems.append(f"losses differ from the loop without pause/resume: {plain_losses.tolist()}")
    if len(rollouts) != len(plain_rollouts) or not all(torch.equal(a, b) for a, b in zip(rollouts, plain_rollouts)):
        problems.append("rollouts differ from the loop without pause/resume")
    for problem in problems:
        print(f"FAIL: {problem}")
    if not problems:
        print(f"PASS: {len(losses)} losses and {sum(r.numel() for r in rollouts)} rollout tokens bitwise equal to the loop without "
              f"pause/resume; every pause gave back at least 99% of the tag's device memory")
        print("OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
