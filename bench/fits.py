"""fits: the most work that trains under a memory cap, for PyTorch's default allocator, expandable segments and
strata (device; PyTorch 2.11, transformers, no network: models are built from configs with random weights).

For each model the work per step is one number W (tokens per batch for the transformers, images per batch for
the ResNet); every step draws its own shape (sequence length, image size) from a seeded generator, so the
allocator sees new sizes each step, as in real training. A trial trains `--steps` steps at W in a fresh process
under the cap and fits if no step runs out of memory. Per allocator, W doubles from `--start` until a trial
fails, then bisection narrows the largest W that fits to `--resolution` (a share of W). The three allocators
bisect at the same time, each process under its own cap; `--parallel-models` runs every model's searches at once
too (a card with room for 3 x models x cap). Past `--budget` seconds no trial starts: a search cut short reports
its bracket (fits at lo, fails at hi, or not found) and the table marks it.

Why the cap binds where it does: each fitting trial records its peak reserved and peak allocated bytes, each
failing one the allocator's out-of-memory message (bytes live, bytes asked for, what the allocator held); the
table quotes peak reserved / peak allocated at each allocator's largest fit.

Caps: PyTorch's allocators by torch.cuda.set_per_process_memory_fraction(cap / device memory); strata by its
configuration's limit=CAP (bytes held from CUDA and bytes in use, fixed when its stack is built).

    python3 bench/fits.py --cap-gib 8 --out OUT [--models gpt2_varlen,llama_varlen,bert_varlen,resnet18_varsize]
                          [--parallel-models] [--budget SECONDS] [--start model=W,...]
Writes OUT/fits.json (every trial) and OUT/fits.md (the table), and prints the table.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = ["gpt2_varlen", "llama_varlen", "bert_varlen", "resnet18_varsize"]
ALLOCATORS = ["native", "expandable", "strata"]
OOM_EXIT = 3


# ---- one trial, in its own process ------------------------------------------------------------------------
def build(name, work, gen):
    """(model, batches): `batches(step)` gives (input, target) of about `work` units on the host."""
    import torch
    import torch.nn.functional as F
    if name == "gpt2_varlen":
        sys.path.insert(0, os.path.join(ROOT, "tests", "device", "torch"))
        from models import GPT2
        model, vocab, lengths = GPT2(layers=12, d=768, heads=12, ctx=1024), 50257, (128, 1024)
    elif name in ("llama_varlen", "bert_varlen"):
        import transformers
        transformers.set_seed(0)
        if name == "llama_varlen":
            cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                           num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048)
            model, vocab, lengths = transformers.LlamaForCausalLM(cfg), 32000, (128, 2048)
        else:
            cfg = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512)   # BERT-base
            model, vocab, lengths = transformers.BertForMaskedLM(cfg), 30522, (64, 512)
    elif name == "resnet18_varsize":
        sys.path.insert(0, os.path.join(ROOT, "tests", "device", "torch"))
        from models import ResNet18
        model = ResNet18()

        def images(step):
            size = int(torch.randint(4, 8, (1,), generator=gen)) * 32   # 128 .. 224
            return torch.randn(work, 3, size, size, generator=gen), torch.randint(0, 1000, (work,), generator=gen)

        return model, images, lambda m, x, y: F.cross_entropy(m(x), y)
    else:
        raise SystemExit(f"unknown model {name}; known: {', '.join(MODELS)}")

    def tokens(step):
        length = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=gen))
        batch = max(1, work // length)
        ids = torch.randint(0, vocab, (batch, length), generator=gen)
        return ids, ids

    def loss(m, x, y):
        if name == "gpt2_varlen":
            logits = m(x)
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1))
        return m(input_ids=x, labels=y).loss

    return model, tokens, loss


def trial(a):
    cap = int(a.cap_gib * (1 << 30))
    if a.allocator == "strata":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import strata_torch
        strata_torch.enable(f"stack=default,limit={cap}B", backend="strata")
    import torch
    total = torch.cuda.get_device_properties(0).total_memory
    if a.allocator != "strata":
        torch.cuda.set_per_process_memory_fraction(cap / total)
    gen = torch.Generator().manual_seed(0)
    model, batches, loss_fn = build(a.model, a.work, gen)
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    try:
        for step in range(a.steps):
            x, y = batches(step)
            loss = loss_fn(model, x.cuda(non_blocking=True), y.cuda(non_blocking=True))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        print("OOM " + str(e).splitlines()[0][:300], flush=True)
        sys.exit(OOM_EXIT)
    print("FITS " + json.dumps({"peak_reserved": torch.cuda.max_memory_reserved(),
                                "peak_allocated": torch.cuda.max_memory_allocated()}), flush=True)


# ---- the search -----------------------------------------------------------------------------------------
def run_trial(model, allocator, work, a, log):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    if allocator == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    argv = [sys.executable, __file__, "--trial", "--model", model, "--allocator", allocator, "--work", str(work),
            "--cap-gib", str(a.cap_gib), "--steps", str(a.steps)]
    start = time.time()
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=a.trial_timeout)
    fits = p.returncode == 0
    if p.returncode not in (0, OOM_EXIT):
        raise RuntimeError(f"{model}/{allocator} at {work}: exit {p.returncode}: {p.stderr.strip()[-1500:]}")
    log.append({"model": model, "allocator": allocator, "work": work, "fits": fits, "seconds": round(time.time() - start, 1),
                "detail": (p.stdout.strip().splitlines() or [""])[-1][:300]})
    return fits


class OutOfTime(Exception):
    def __init__(self, lo, hi):
        super().__init__(f"budget spent: fits at {lo}, " + (f"fails at {hi}" if hi else "no failure seen yet"))
        self.lo, self.hi = lo, hi


def largest(model, allocator, a, log, granule, start):
    """The largest work that fits: doubling from the start, then bisection to --resolution."""
    lo, hi, w = 0, None, start

    def attempt(work):
        if time.time() > a.deadline:
            raise OutOfTime(lo, hi)
        return run_trial(model, allocator, work, a, log)

    while hi is None:
        if attempt(w):
            lo, w = w, w * 2
        else:
            hi = w
        if w > start * 4096:
            raise RuntimeError(f"{model}/{allocator}: still fits at {lo}; raise the cap or lower --start")
    while hi - lo > max(granule, int(lo * a.resolution)):
        mid = (lo + hi) // 2 // granule * granule
        if mid <= lo:
            break
        if attempt(mid):
            lo = mid
        else:
            hi = mid
    return lo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model")
    ap.add_argument("--allocator", choices=ALLOCATORS)
    ap.add_argument("--work", type=int)
    ap.add_argument("--cap-gib", type=float, default=8.0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    ap.add_argument("--resolution", type=float, default=0.02, help="stop when the bracket is this share of W")
    ap.add_argument("--trial-timeout", type=int, default=300)
    ap.add_argument("--parallel-models", action="store_true", help="search every model at once")
    ap.add_argument("--budget", type=float, default=float("inf"), help="start no trial after this many seconds")
    ap.add_argument("--start", default="", help="model=W,...: where doubling starts (default 2048 tokens, 8 images)")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    if a.trial:
        return trial(a)
    os.makedirs(a.out, exist_ok=True)
    a.deadline = time.time() + a.budget
    starts = {}
    for item in filter(None, a.start.split(",")):
        name, _, value = item.partition("=")
        if name not in MODELS or not value.isdigit() or int(value) <= 0:
            raise SystemExit(f"--start: {item!r} is not model=W with a known model ({', '.join(MODELS)}) and W > 0")
        starts[name] = int(value)
    log, results = [], {}

    def search_model(model):
        granule, start = (1, 8) if model.startswith("resnet") else (64, 2048)
        start = starts.get(model, start)
        found, errors, brackets = {}, {}, {}

        def search(alloc):
            try:
                found[alloc] = largest(model, alloc, a, log, granule, start)
            except OutOfTime as e:   # reported as a bracket, never as a result
                brackets[alloc] = [e.lo, e.hi]
                errors[alloc] = str(e)
            except Exception as e:   # reported in the table, never silently dropped
                errors[alloc] = str(e)

        threads = [threading.Thread(target=search, args=(al,)) for al in a.allocators.split(",")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results[model] = {"largest": found, "errors": errors, "brackets": brackets}
        print(f"{model}: {found} {errors or ''}", flush=True)

    models = a.models.split(",")
    if a.parallel_models:
        threads = [threading.Thread(target=search_model, args=(m,)) for m in models]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = {m: results[m] for m in models}
    else:
        for m in models:
            search_model(m)

    def peak_ratio(model, alloc, work):
        for t in log:
            if t["model"] == model and t["allocator"] == alloc and t["work"] == work and t["fits"]:
                figures = json.loads(t["detail"].split(" ", 1)[1])
                return figures["peak_reserved"] / max(1, figures["peak_allocated"])
        return None

    unit = {m: ("images" if m.startswith("resnet") else "tokens") for m in results}
    lines = [f"Largest work per step that trains under a {a.cap_gib:g} GiB cap ({a.steps} steps, shapes drawn per step; "
             f"bisection to {a.resolution:.0%}); in brackets, peak reserved / peak allocated at that work", "",
             "| model | unit | PyTorch default | expandable segments | strata | strata / expandable | strata / default |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for m, r in results.items():
        f = r["largest"]

        def cell(k, m=m, r=r, f=f):
            if k in f:
                q = peak_ratio(m, k, f[k])
                return f"{f[k]}" + (f" ({q:.3f})" if q else "")
            if k in r["brackets"]:
                lo, hi = r["brackets"][k]
                return f"≥ {lo}" + (f", < {hi}" if hi else "") + " (budget spent)"
            return "error" if k in r["errors"] else "-"

        ratio = lambda x, y: f"{f[x] / f[y]:.3f}" if x in f and y in f and f[y] else "-"   # noqa: E731
        lines.append(f"| {m} | {unit[m]} | {cell('native')} | {cell('expandable')} | {cell('strata')} | "
                     f"{ratio('strata', 'expandable')} | {ratio('strata', 'native')} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "fits.json"), "w") as fh:
        json.dump({"cap_gib": a.cap_gib, "steps": a.steps, "resolution": a.resolution, "results": results, "trials": log},
                  fh, indent=1)
    with open(os.path.join(a.out, "fits.md"), "w") as fh:
        fh.write(table)
    print(table)
    if any(r["errors"] for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
