"""Every PyTorch/CuPy device check, each part its own process with a time limit. Prints one
PASS/FAIL/SKIP line per check, writes results.json, memory.md and log.txt under --out, and exits non-zero
if any check failed. Run through tests/device/torch.sh, which builds the plug-in first.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TRAIN = os.path.join(HERE, "train.py")

results, verdicts = {}, []
log = None


def run(name, argv, timeout, env_extra=None):
    """Run one part; returns (returncode, parsed last JSON line or None). Everything it prints goes to log.txt."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(env_extra or {})
    start = time.time()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    log.write(f"\n===== {name}: {' '.join(argv)}  (rc={rc}, {time.time() - start:.1f} s)\n{out}\n--- stderr\n{err[-20000:]}\n")
    log.flush()
    parsed = None
    for line in reversed(out.strip().splitlines()):
        try:
            parsed = json.loads(line)
            break
        except ValueError:
            continue
    return rc, parsed, out + err


def verdict(name, ok, detail=""):
    word = {True: "PASS", False: "FAIL", None: "SKIP"}[ok]
    verdicts.append((name, word, detail))
    print(f"{word} {name}{': ' + detail if detail else ''}", flush=True)


def train(model, alloc, mode, steps, timeout=150, extra=()):
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if alloc == "expandable" else {}
    if alloc != "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = ""
    rc, parsed, _ = run(f"{model}/{alloc}/{mode}", [sys.executable, TRAIN, "--model", model, "--alloc", alloc,
                                                  "--mode", mode, "--steps", str(steps), *extra], timeout, env)
    return parsed if rc == 0 else None


def compare_losses(a, b):
    if a["losses_hex"] == b["losses_hex"]:
        return "bitwise", 0.0
    worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a["losses"], b["losses"]))
    return ("within 1e-3" if worst <= 1e-3 else "differ"), worst


def correctness(steps):
    for model in ("resnet18", "gpt2"):
        native, strata = train(model, "native", "correctness", steps), train(model, "strata", "correctness", steps)
        results[f"correctness/{model}"] = {"native": native, "strata": strata}
        if native is None or strata is None:
            verdict(f"correctness {model}", False, f"a run failed (native ok: {native is not None}, "
                                                   f"strata ok: {strata is not None}); see log.txt")
            continue
        kind, worst = compare_losses(native, strata)
        results[f"correctness/{model}"]["comparison"] = {"kind": kind, "max_relative_difference": worst}
        verdict(f"correctness {model} losses native vs strata", kind != "differ",
                f"{kind} over {len(native['losses'])} steps (max rel. diff {worst:.2e})")
        graph_ok = bool(strata["graph"]) and all(abs(g - e) <= 1e-3 * max(abs(e), 1e-12) for g, e in strata["graph"])
        verdict(f"correctness {model} CUDA graph replay under strata", graph_ok,
                f"replayed vs eager: {strata['graph']}; hooks: {sorted(strata.get('hooks', {}).values())}")
        before, after = strata.get("empty_cache_reserved", [0, 0])
        verdict(f"correctness {model} empty_cache releases under strata", after <= before,
                f"reserved {before} -> {after} bytes")


def memory_and_speed(steps):
    rows = []
    for model in ("resnet18", "gpt2", "gpt2_varlen"):
        runs = {alloc: train(model, alloc, "perf", steps) for alloc in ("native", "expandable", "strata")}
        results[f"perf/{model}"] = runs
        if any(r is None for r in runs.values()):
            verdict(f"memory {model}", False, "a run failed; see log.txt")
            continue
        for alloc, r in runs.items():
            rows.append((model, alloc, r["peak_reserved"], r["peak_allocated"], r["ratio"], r["steps_per_s_median"]))
        s, n, e = runs["strata"], runs["native"], runs["expandable"]
        verdict(f"memory {model}: strata peak reserved below native and expandable",
                s["peak_reserved"] < n["peak_reserved"] and s["peak_reserved"] < e["peak_reserved"],
                f"strata {s['peak_reserved'] / 2**30:.3f} GiB, native {n['peak_reserved'] / 2**30:.3f} GiB, "
                f"expandable {e['peak_reserved'] / 2**30:.3f} GiB")
        speed = s["steps_per_s_median"] / n["steps_per_s_median"]
        verdict(f"speed {model}: strata within 1% of native", speed >= 0.99,
                f"{s['steps_per_s_median']:.2f} vs {n['steps_per_s_median']:.2f} steps/s ({speed:.3f}x)")
    return rows


def markdown(rows):
    lines = ["| workload | allocator | peak reserved (GiB) | peak allocated (GiB) | reserved / allocated | steps/s (median) |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for model, alloc, res, alc, ratio, sps in rows:
        lines.append(f"| {model} | {alloc} | {res / 2**30:.3f} | {alc / 2**30:.3f} | {ratio:.3f} | {sps:.2f} |")
    return "\n".join(lines) + "\n"


def oom():
    rc, parsed, _ = run("oom", [sys.executable, os.path.join(HERE, "oom.py")], 180)
    results["oom"] = parsed
    if parsed is None:
        verdict("oom: process survives growing the batch until out of memory", False, f"rc={rc}; see log.txt")
        return
    for check, ok in parsed["checks"].items():
        detail = f"largest batch {parsed['largest_batch']}, error {parsed['error']}" if "raised" in check else ""
        verdict(f"oom: {check}", ok, detail)


def example(name, path, argv=(), timeout=120, needs=None):
    if needs:
        probe = subprocess.run([sys.executable, "-c", f"import {needs}"], capture_output=True)
        if probe.returncode != 0:
            verdict(f"example {name}", None, f"{needs} is not installed")
            return
    rc, _, text = run(f"example {name}", [sys.executable, os.path.join(ROOT, path), *argv], timeout)
    results[f"example/{name}"] = {"rc": rc}
    verdict(f"example {name}", rc == 0 and any(line.strip() == "OK" for line in text.splitlines()), f"rc={rc}")


def examples():
    example("train_one_line", "examples/torch/train_one_line.py")
    example("scoped_mempool", "examples/torch/scoped_mempool.py")
    example("adaptive_batch", "examples/torch/adaptive_batch.py")
    example("cupy", "examples/cupy/cupy_example.py", needs="cupy")
    example("rl_sleep_wake", "examples/torch/rl_sleep_wake.py", ("--check",), timeout=300, needs="transformers")


def sanitizer():
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        verdict("compute-sanitizer memcheck", None, "compute-sanitizer not found")
        return
    rc, _, text = run("memcheck", [tool, "--tool", "memcheck", "--error-exitcode", "9", sys.executable, TRAIN,
                                   "--model", "tiny_gpt2", "--alloc", "strata", "--mode", "correctness",
                                   "--steps", "4"], 240)
    if "Device not supported" in text:
        verdict("compute-sanitizer memcheck", None, "this machine's driver does not support compute-sanitizer")
        return
    summary = [line for line in text.splitlines() if "ERROR SUMMARY" in line]
    results["memcheck"] = {"rc": rc, "summary": summary}
    verdict("compute-sanitizer memcheck (tiny GPT-2, strata, 4 steps + graph)",
            rc == 0 and bool(summary) and " 0 errors" in summary[-1], f"{summary[-1:] or 'no summary'}, rc={rc}")


def main():
    global log
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/strata-torch-device"))
    p.add_argument("--only", default="", help="comma-separated subset: correctness,perf,oom,examples,memcheck")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--perf-steps", type=int, default=48)
    p.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET_S", 400)),
                   help="seconds after which the parts not yet started are skipped (and said so)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "log.txt"), "w")
    parts = set(filter(None, args.only.split(","))) or {"correctness", "perf", "oom", "examples", "memcheck"}
    # Asked in a child: this process must not hold a CUDA context (memory) while the runs measure.
    probe = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps([torch.__version__, "
                            "torch.cuda.get_device_name(0)]))"], capture_output=True, text=True)
    version, device = json.loads(probe.stdout) if probe.returncode == 0 else ("?", "?")
    print(f"torch {version}, {device}; plug-in {os.environ.get('STRATA_ALLOC_LIBRARY', '(installed package)')}",
          flush=True)
    results["environment"] = {"torch": version, "device": device}
    started = time.time()
    rows = []
    steps = [("correctness", lambda: correctness(args.steps)),
             ("perf", lambda: rows.extend(memory_and_speed(args.perf_steps))),
             ("oom", oom),
             ("examples", examples),
             ("memcheck", sanitizer)]
    for part, step in steps:
        if part not in parts:
            continue
        if time.time() - started > args.budget:   # the device call has a hard limit: say what did not run
            verdict(f"{part} (not run)", None, f"over the {args.budget} s budget; run it with ONLY={part}")
            continue
        step()
    results["verdicts"] = verdicts
    results["seconds"] = time.time() - started
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    if rows:
        with open(os.path.join(args.out, "memory.md"), "w") as f:
            f.write(markdown(rows))
        print(markdown(rows))
    failed = sum(1 for _, word, _ in verdicts if word == "FAIL")
    print(f"{len(verdicts) - failed} passed or skipped, {failed} failed ({time.time() - started:.0f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
