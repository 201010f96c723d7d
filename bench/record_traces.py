#!/usr/bin/env python3
"""Records generation and inference allocation traces from PyTorch's own caching allocator (GPU, transformers).

    python3 bench/record_traces.py --out DIR [--workloads a,b,...] [--list]

Each workload runs twice, each time in a process of its own, all of them side by side: once under PyTorch's default allocator with
`torch.cuda.memory._record_memory_history` on (the trace), once with expandable segments (its figures only).
Writes DIR/<workload>.csv.gz in bench/traces' format (`op,id,bytes,stream`; `a` allocate, `f` free; streams
numbered from 0 in order of first use) and DIR/figures.jsonl: per workload and allocator, peak reserved and
peak allocated (`torch.cuda.max_memory_reserved` / `max_memory_allocated`) and the trace's counts. Models are
built from transformers configs with random weights (no network needed), bf16, greedy or beam search.
"""

import argparse
import gzip
import json
import os
import subprocess
import sys

# name -> (model family, list of (batch, prompt tokens, new tokens), beams)
WORKLOADS = {
    "gpt2_generate_b1": ("gpt2", [(1, 16, 256), (1, 64, 192), (1, 200, 128)], 1),
    "gpt2_generate_mixed": ("gpt2", [(1, 32, 96), (8, 48, 64), (3, 120, 80), (16, 16, 48), (5, 300, 40)], 1),
    "qwen2_generate_mixed": ("qwen2", [(1, 64, 128), (6, 96, 64), (12, 24, 96), (2, 400, 48)], 1),
    "gpt2_beam4": ("gpt2", [(1, 32, 64), (2, 80, 48), (4, 16, 40)], 4),
}


def build_model(family):
    import torch
    import transformers

    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
        model = transformers.GPT2LMHeadModel(config)
    elif family == "qwen2":
        config = transformers.Qwen2Config(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                          num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                                          max_position_embeddings=2048)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        raise ValueError(f"unknown model family {family!r}")
    return model.to(device="cuda", dtype=torch.bfloat16).eval(), config.vocab_size


def run_workload(name, trace_path):
    """In this process: runs the workload, writes the trace if asked, prints the figures as one JSON line. The
    recording starts before the model is built, so the weights are in the trace as they are in PyTorch's peaks."""
    import torch

    family, shapes, beams = WORKLOADS[name]
    torch.cuda.init()
    if trace_path:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=2_000_000)
    model, vocab = build_model(family)
    generator = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for batch, prompt, new in shapes:
            ids = torch.randint(0, vocab, (batch, prompt), device="cuda", generator=generator)
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, num_beams=beams, pad_token_id=0)
            del ids
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
        figures.update(write_trace(snapshot["device_traces"][torch.cuda.current_device()], trace_path))
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
    if next_id >= 1_900_000:
        raise RuntimeError(f"{path}: the trace may have overflowed the recorder's ring ({next_id} allocations)")
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
    failed = 0
    with open(os.path.join(args.out, "figures.jsonl"), "a") as figures:
        for name, expandable, proc in runs:
            out, err = proc.communicate()
            if proc.returncode != 0:
                failed += 1
                print(f"{name} ({'expandable' if expandable else 'default'}) failed:\n{err[-3000:]}", flush=True)
                continue
            line = out.strip().splitlines()[-1]
            figures.write(line + "\n")
            print(line, flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
