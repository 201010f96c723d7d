#!/usr/bin/env python3
"""Records allocation traces of generation, prefill and training from PyTorch's own caching allocator (GPU,
transformers, torchvision).

    python3 bench/record_traces.py --out DIR [--workloads a,b,...] [--list]

Each workload runs twice, each time in a process of its own, all of them side by side: once under PyTorch's default allocator with
`torch.cuda.memory._record_memory_history` on (the trace), once with expandable segments (its figures only).
Writes DIR/<workload>.csv.gz in bench/traces' format (`op,id,bytes,stream`; `a` allocate, `f` free; streams
numbered from 0 in order of first use) and DIR/figures.jsonl: per workload and allocator, peak reserved and
peak allocated (`torch.cuda.max_memory_reserved` / `max_memory_allocated`) and the trace's counts. Models are
built from configs with random weights (no network needed); generation in bf16 (greedy or beam search, the
key/value cache transformers' dynamic cache, which grows by one token per step), training in fp32 weights with
bf16 autocast (the detector in fp32) and every shape drawn per step from a seeded generator.
"""

import argparse
import gzip
import json
import os
import subprocess
import sys

# Generation: name -> (model family, list of (batch, prompt tokens, new tokens), beams)
GENERATION = {
    "gpt2_generate_b1": ("gpt2", [(1, 16, 256), (1, 64, 192), (1, 200, 128)], 1),
    "gpt2_generate_mixed": ("gpt2", [(1, 32, 96), (8, 48, 64), (3, 120, 80), (16, 16, 48), (5, 300, 40)], 1),
    "qwen2_generate_mixed": ("qwen2", [(1, 64, 128), (6, 96, 64), (12, 24, 96), (2, 400, 48)], 1),
    "gpt2_beam4": ("gpt2", [(1, 32, 64), (2, 80, 48), (4, 16, 40)], 4),
    # The key/value cache outweighs the weights: GPT-2 medium at batches of 8-32 for hundreds of tokens.
    "gpt2m_generate_kvcache": ("gpt2_medium", [(16, 128, 512), (32, 64, 320), (8, 600, 400)], 1),
    # Long-context prefill: one forward over 8k-32k tokens, then a few tokens each.
    "llama_prefill_long": ("llama_long", [(1, 16384, 8), (2, 8192, 8), (1, 32000, 4), (1, 24576, 8)], 1),
}
# Training: name -> (model family, steps); each step draws its own shapes (see `train_batches`).
TRAINING = {
    "mixtral_moe_train": ("mixtral", 10),       # 8 experts, top-2; about 12k tokens a step, length per step
    "t5_train_varlen": ("t5", 14),              # encoder and decoder lengths and batch per step
    "fasterrcnn_train_multiscale": ("fasterrcnn", 12),  # image sizes per step, multi-scale resize
}
WORKLOADS = {**GENERATION, **TRAINING}
# Events the recorder keeps (an allocation is three: alloc, free_requested, free_completed); once full it drops
# the oldest, the weights first, so a workload must stay below it.
RING = 8_000_000


def build_model(family):
    import torch
    import transformers

    torch.manual_seed(0)
    if family in ("gpt2", "gpt2_medium"):
        layers, width, heads = (12, 768, 12) if family == "gpt2" else (24, 1024, 16)
        config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=1024,
                                         vocab_size=50257)
        model = transformers.GPT2LMHeadModel(config)
    elif family == "qwen2":
        config = transformers.Qwen2Config(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                          num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                                          max_position_embeddings=2048)
        model = transformers.Qwen2ForCausalLM(config)
    elif family == "llama_long":
        config = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                          num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                                          max_position_embeddings=32768)
        model = transformers.LlamaForCausalLM(config)
    else:
        raise ValueError(f"unknown model family {family!r}")
    return model.to(device="cuda", dtype=torch.bfloat16).eval(), config.vocab_size


def build_trainee(family):
    """The model in fp32 on the GPU, in training mode."""
    import torch
    import transformers

    torch.manual_seed(0)
    if family == "mixtral":
        config = transformers.MixtralConfig(hidden_size=1024, intermediate_size=1792, num_hidden_layers=6,
                                            num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
                                            num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=4096)
        model = transformers.MixtralForCausalLM(config)
    elif family == "t5":
        config = transformers.T5Config(d_model=768, d_ff=3072, d_kv=64, num_layers=8, num_decoder_layers=8,
                                       num_heads=12, vocab_size=32128, decoder_start_token_id=0)
        model = transformers.T5ForConditionalGeneration(config)
    elif family == "fasterrcnn":
        import torchvision
        model = torchvision.models.detection.fasterrcnn_resnet50_fpn(
            weights=None, weights_backbone=None, num_classes=91, min_size=tuple(range(480, 801, 32)),
            max_size=1333)
    else:
        raise ValueError(f"unknown model family {family!r}")
    return model.to("cuda").train()


def train_batches(family, step, gen):
    """The step's inputs on the host, drawn from `gen`: keyword arguments of the model's call (transformers) or
    (images, targets) (the detector)."""
    import torch

    def draw(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))
    if family == "mixtral":
        length = draw(256, 2048)
        batch = max(1, 12288 // length)
        ids = torch.randint(0, 32000, (batch, length), generator=gen)
        return {"input_ids": ids, "labels": ids}
    if family == "t5":
        batch, source, target = draw(8, 32), draw(64, 512), draw(16, 192)
        return {"input_ids": torch.randint(0, 32128, (batch, source), generator=gen),
                "labels": torch.randint(0, 32128, (batch, target), generator=gen)}
    images, targets = [], []
    for _ in range(4):
        height, width, boxes = draw(400, 1000), draw(400, 1000), draw(1, 20)
        corner = torch.rand(boxes, 2, generator=gen) * torch.tensor([width * 0.7, height * 0.7])
        extent = torch.rand(boxes, 2, generator=gen) * torch.tensor([width * 0.3, height * 0.3]) + 8
        images.append(torch.rand(3, height, width, generator=gen))
        targets.append({"boxes": torch.cat([corner, corner + extent], 1),
                        "labels": torch.randint(1, 91, (boxes,), generator=gen)})
    return images, targets


def train(family, steps):
    import torch

    model = build_trainee(family)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4) if family != "fasterrcnn" else \
        torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        batch = train_batches(family, step, gen)
        if family == "fasterrcnn":
            images = [i.cuda() for i in batch[0]]
            targets = [{k: v.cuda() for k, v in t.items()} for t in batch[1]]
            loss = sum(model(images, targets).values())
        else:
            inputs = {k: v.cuda() for k, v in batch.items()}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, batch
    return model, opt


def generate(family, shapes, beams):
    import torch

    model, vocab = build_model(family)
    generator = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for batch, prompt, new in shapes:
            ids = torch.randint(0, vocab, (batch, prompt), device="cuda", generator=generator)
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, num_beams=beams, pad_token_id=0)
            del ids
    return model


def run_workload(name, trace_path):
    """In this process: runs the workload, writes the trace if asked, prints the figures as one JSON line. The
    recording starts before the model is built, so the weights (and the optimizer's state) are in the trace as
    they are in PyTorch's peaks; they stay live to the end, as they do in a program."""
    import torch

    torch.cuda.init()
    if trace_path:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=RING)
    kept = generate(*GENERATION[name]) if name in GENERATION else train(*TRAINING[name])
    torch.cuda.synchronize()
    figures = {"workload": name, "allocator": "expandable" if "expandable_segments:True" in os.environ.get(
        "PYTORCH_CUDA_ALLOC_CONF", "") else "default", "peak_reserved": torch.cuda.max_memory_reserved(),
               "peak_allocated": torch.cuda.max_memory_allocated(),
               "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0)}
    if figures["alloc_retries"]:  # the cache was flushed under memory pressure: the peaks are not the workload's
        sys.exit(f"{name}: {figures['alloc_retries']} allocation retries (the device ran short); run it alone")
    if trace_path:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        events = snapshot["device_traces"][torch.cuda.current_device()]
        if len(events) >= RING:
            sys.exit(f"{name}: {len(events)} events filled the recorder's ring: the oldest were dropped")
        figures.update(write_trace(events, trace_path))
    print(json.dumps(figures), flush=True)


def write_trace(events, path):
    """The snapshot's allocation events as a trace: a request's allocate and its free as the program made them
    (`alloc` and `free_requested`; the allocator's own later completion is not the program's)."""
    live, streams, rows = {}, {}, []
    next_id = peak = now = allocations = 0
    for e in events:
        action = e["action"]
        if action == "alloc":
            stream = streams.setdefault(e["stream"], len(streams))
            live[e["addr"]] = (next_id, e["size"])
            rows.append(f"a,{next_id},{e['size']},{stream}")
            next_id += 1
            allocations += 1
            now += e["size"]
            peak = max(peak, now)
        elif action in ("free_requested", "free_completed") and e["addr"] in live:  # a completion alone: no request recorded
            ident, size = live.pop(e["addr"])
            rows.append(f"f,{ident},{size},{streams.get(e['stream'], 0)}")
            now -= size
    with gzip.open(path, "wt") as f:
        f.write("op,id,bytes,stream\n" + "\n".join(rows) + "\n")
    return {"allocations": allocations, "trace_peak_live": peak, "streams": len(streams)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child process: run this workload here
    p.add_argument("--trace", help=argparse.SUPPRESS)
    p.add_argument("--list", action="store_true")
    args = p.parse_args()
    if args.list:
        print("\n".join(WORKLOADS))
        return
    if args.one:
        run_workload(args.one, args.trace)
        return
    if not args.out:
        sys.exit("--out DIR is required")
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        sys.exit(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    os.makedirs(args.out, exist_ok=True)
    # Every run is a process of its own and runs beside the others: each allocator's figures and each trace
    # are the process's own, whatever else shares the device.
    runs = []
    for name in names:
        for expandable in (False, True):
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            cmd = [sys.executable, __file__, "--one", name]
            if expandable:
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            else:
                cmd += ["--trace", os.path.join(args.out, f"{name}.csv.gz")]
            runs.append((name, expandable, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    # A workload's lines are written only when both of its runs succeeded: its figures go together.
    lines, failed = {}, set()
    for name, expandable, proc in runs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            failed.add(name)
            print(f"{name} ({'expandable' if expandable else 'default'}) failed:\n{err[-3000:]}", flush=True)
            continue
        lines.setdefault(name, []).append(out.strip().splitlines()[-1])
    with open(os.path.join(args.out, "figures.jsonl"), "a") as figures:
        for name in names:
            if name in failed:
                continue
            for line in lines[name]:
                figures.write(line + "\n")
                print(line, flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
