"""Peak reserved memory under CUDA graphs' private pools, PyTorch's allocator against strata's backend, with
the losses compared. Each (model, mode, allocator) runs in a process of its own from a fresh CUDA context:
models  gpt2_train     a 4-layer GPT-2 (768 wide) trained with AdamW, batch 8 x 256 tokens
        gpt2_generate  the same model generating: greedy decoding over a fixed 256-token window, no grad
        cnn_train      a ResNet-18 (width 32) trained with SGD + momentum on 32 images of 128 x 128
modes   compile-ro     the model under torch.compile(mode="reduce-overhead") (CUDA graph trees and their
                       checkpointed pool), the optimizer eager
        graph          one torch.cuda.graph per step (training: forward, backward and a capturable optimizer's
                       step; generation: one forward), replayed with new inputs copied in
Prints a table (peak reserved and peak allocated in MiB per allocator) and exits non-zero if strata's peak
reserved exceeds PyTorch's on any row, or any loss differs beyond --rtol (default 1e-4; TF32 off, deterministic
algorithms where PyTorch has them).
    python3 tests/device/torch/graph_pool_memory.py [--conf stack=default] [--models a,b] [--modes a,b]
            [--steps 12] [--rtol 1e-4] [--out DIR]
One row alone: python3 tests/device/torch/graph_pool_memory.py --child MODEL MODE ALLOCATOR (prints one JSON line).
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ["gpt2_train", "gpt2_generate", "cnn_train"]
MODES = ["compile-ro", "graph"]
MiB = 1 << 20


def arg(name, default):
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args else default


def child(model_name, mode, allocator, steps, conf):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if allocator == "strata":
        import strata_torch

        strata_torch.enable(conf, backend="strata")
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, HERE)
    from models import GPT2, ResNet18

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = "cuda"
    gen = torch.Generator().manual_seed(1)
    training = model_name.endswith("_train")
    if model_name.startswith("gpt2"):
        model = GPT2(layers=4, d=768, heads=12, ctx=256, vocab=50257).to(dev)
        batch, seq, vocab = 8, 256, 50257

        def make_batch():
            tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
            return tokens[:, :-1].contiguous().to(dev), tokens[:, 1:].contiguous().to(dev)

        def loss_fn(out, target):
            return F.cross_entropy(out.float().view(-1, out.shape[-1]), target.view(-1))
    else:
        model = ResNet18(classes=100, width=32).to(dev)

        def make_batch():
            return (torch.randn(32, 3, 128, 128, generator=gen).to(dev), torch.randint(0, 100, (32,), generator=gen).to(dev))

        loss_fn = F.cross_entropy
    if training:
        model.train()
        if model_name.startswith("gpt2"):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=(mode == "graph"))
        else:
            opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    else:
        model.eval()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    losses = []

    net = torch.compile(model, mode="reduce-overhead") if mode == "compile-ro" else model

    if training:
        def step(x, y):
            if mode == "compile-ro":
                # CUDA graph trees: a new step begins, and the gradients are not kept between steps (a kept
                # gradient would be an output of the previous replay, which this one overwrites).
                torch.compiler.cudagraph_mark_step_begin()
            out = net(x)
            loss = loss_fn(out, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=(mode == "compile-ro"))
            return loss.detach()
    else:
        def step(x, y):
            with torch.no_grad():
                logits = net(x)
                nxt = logits[:, -1].argmax(-1)
                return F.cross_entropy(logits[:, -1].float(), y[:, -1]).detach(), nxt

    if mode == "compile-ro":
        x, y = make_batch()
        for _ in range(steps):
            if training:
                x, y = make_batch()
                losses.append(float(step(x, y).clone()))
            else:
                loss, nxt = step(x, y)
                losses.append(float(loss.clone()))
                x = torch.cat([x[:, 1:], nxt.clone().unsqueeze(1)], dim=1)  # slide the window by the new token
    elif mode == "graph":
        static_x, static_y = make_batch()
        warm = torch.cuda.Stream()
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):  # warm-up outside the capture (optimizer state made), as PyTorch's docs ask
            for _ in range(3):
                out = step(static_x, static_y)
        torch.cuda.current_stream().wait_stream(warm)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = step(static_x, static_y)
        x, y = make_batch()
        for _ in range(steps):
            if training:
                x, y = make_batch()
            static_x.copy_(x)
            static_y.copy_(y)
            g.replay()
            if training:
                losses.append(float(out.clone()))
            else:
                loss, nxt = out
                losses.append(float(loss.clone()))
                x = torch.cat([static_x[:, 1:], nxt.clone().unsqueeze(1)], dim=1)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    torch.cuda.synchronize()
    print("RESULT " + json.dumps({"model": model_name, "mode": mode, "allocator": allocator, "losses": losses,
                                  "peak_reserved": torch.cuda.max_memory_reserved(),
                                  "peak_allocated": torch.cuda.max_memory_allocated()}), flush=True)


def main():
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        model_name, mode, allocator = sys.argv[i + 1:i + 4]
        return child(model_name, mode, allocator, int(arg("--steps", "12")), arg("--conf", "stack=default"))
    models = arg("--models", ",".join(MODELS)).split(",")
    modes = arg("--modes", ",".join(MODES)).split(",")
    rtol = float(arg("--rtol", "1e-4"))
    out_dir = arg("--out", None)
    rows, failures = [], []
    for model_name in models:
        for mode in modes:
            got = {}
            for allocator in ("native", "strata"):
                cmd = [sys.executable, os.path.abspath(__file__), "--child", model_name, mode, allocator,
                       "--steps", arg("--steps", "12"), "--conf", arg("--conf", "stack=default")]
                p = subprocess.run(cmd, capture_output=True, text=True)
                line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
                if p.returncode != 0 or line is None:
                    failures.append(f"{model_name}/{mode}/{allocator}: exit {p.returncode}: {(p.stderr or p.stdout)[-1500:]}")
                    continue
                got[allocator] = json.loads(line[len("RESULT "):])
            if len(got) != 2:
                continue
            n, s = got["native"], got["strata"]
            worst = max((abs(a - b) / max(abs(a), 1e-12) for a, b in zip(n["losses"], s["losses"])), default=0.0)
            same_len = len(n["losses"]) == len(s["losses"]) and len(n["losses"]) > 0
            rows.append((model_name, mode, n["peak_reserved"], s["peak_reserved"], n["peak_allocated"], s["peak_allocated"],
                         worst, n["losses"][-1] if n["losses"] else float("nan"), s["losses"][-1] if s["losses"] else float("nan")))
            if s["peak_reserved"] > n["peak_reserved"]:
                failures.append(f"{model_name}/{mode}: strata's peak reserved {s['peak_reserved'] / MiB:.1f} MiB exceeds "
                                f"PyTorch's {n['peak_reserved'] / MiB:.1f} MiB")
            if not same_len or worst > rtol:
                failures.append(f"{model_name}/{mode}: losses differ (largest relative difference {worst:.3g}; "
                                f"native {n['losses']}, strata {s['losses']})")
    header = ("| model | mode | peak reserved MiB, PyTorch | peak reserved MiB, strata | peak allocated MiB, PyTorch | "
              "peak allocated MiB, strata | largest loss difference (relative) | last loss, PyTorch | last loss, strata |")
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2] / MiB:.1f} | {r[3] / MiB:.1f} | {r[4] / MiB:.1f} | {r[5] / MiB:.1f} | "
                     f"{r[6]:.2e} | {r[7]:.6f} | {r[8]:.6f} |")
    table = "\n".join(lines)
    print(table)
    for f in failures:
        print("FAIL " + f)
    print("PASS graph_pool_memory" if not failures else f"graph_pool_memory: {len(failures)} failure(s)")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "graph_pool_memory.md"), "w") as fh:
            fh.write(table + "\n" + "".join(f"FAIL {f}\n" for f in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main() or 0)
