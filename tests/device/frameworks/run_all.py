"""The frameworks suite: strata's PyTorch backend under the torch.cuda memory API, CUDA graphs, MemPool,
torch.compile (default and reduce-overhead), activation checkpointing, torch.multiprocessing, transformers'
Trainer with memory metrics and Lightning's DeviceStatsMonitor; each training run twice, under PyTorch's
allocator and under strata's, at the same time, with the losses compared.
    python3 tests/device/frameworks/run_all.py --out DIR [--only memory_api,contract,mp_share,eager,graph,...]
Prints PASS/FAIL per check and a count; writes DIR/frameworks.log (every run's output) and DIR/results.json.
Exit status 1 if any check failed.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_MODES = ["eager", "checkpoint", "graph", "compile", "compile-ro"]
FRAMEWORKS = ["trainer", "lightning"]
ALL = ["memory_api", "contract", "mp_share"] + TRAIN_MODES + FRAMEWORKS
TOLERANCE = 1e-4   # relative, per step: the runs differ only in addresses


def tagged(text, tag):
    for line in text.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1:])
    return None


class Suite:
    def __init__(self, out):
        self.out = out
        self.results = []
        self.peaks = {}   # run -> allocator -> peak allocated / reserved (measured, not checked)
        self.log = open(os.path.join(out, "frameworks.log"), "w")

    def record(self, name, ok, detail=""):
        self.results.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} {name}" + (f" ({detail})" if ok and detail else f": {detail}" if detail else ""),
              flush=True)

    def logged(self, title, proc_out, proc_err, rc, seconds):
        self.log.write(f"===== {title} (exit {rc}, {seconds:.1f} s)\n{proc_out}\n--- stderr\n{proc_err}\n")
        self.log.flush()

    def script(self, name, argv, timeout):
        start = time.time()
        try:
            p = subprocess.run([sys.executable] + argv, capture_output=True, text=True, timeout=timeout)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, err, rc = str(e.stdout or ""), str(e.stderr or "") + f"\nTIMEOUT after {timeout} s", 124
        self.logged(name, out, err, rc, time.time() - start)
        for line in out.splitlines():   # the script's own checks
            if line.startswith(("PASS ", "FAIL ")):
                self.results.append({"check": line[5:], "ok": line.startswith("PASS"), "detail": ""})
                print(line, flush=True)
        if rc != 0 and not any(l.startswith("FAIL ") for l in out.splitlines()):
            self.record(f"{name}: runs to the end", False, f"exit {rc}: {err.strip()[-1200:]}")

    def pair(self, name, argv, timeout):
        """The same run under both allocators, concurrently; the losses must agree."""
        start = time.time()
        procs = {a: subprocess.Popen([sys.executable] + argv + ["--allocator", a], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for a in ("native", "strata")}
        outs = {}
        for a, p in procs.items():
            try:
                o, e = p.communicate(timeout=max(1, timeout - (time.time() - start)))
            except subprocess.TimeoutExpired:
                p.kill()
                o, e = p.communicate()
                e += "\nTIMEOUT"
            outs[a] = (o, e, p.returncode)
            self.logged(f"{name} under {a}", o, e, p.returncode, time.time() - start)
        losses = {a: tagged(o, "LOSSES") for a, (o, _, _) in outs.items()}
        for a, (o, e, rc) in outs.items():
            if rc != 0 or losses[a] is None:
                self.record(f"{name} under {a}: runs to the end", False, f"exit {rc}: {e.strip()[-1500:]}")
                return None
        n, s = losses["native"], losses["strata"]
        worst = max((abs(x - y) / max(abs(x), 1e-12) for x, y in zip(n, s)), default=float("inf"))
        self.record(f"{name}: strata's losses equal PyTorch's allocator's ({len(s)} steps)",
                    len(n) == len(s) and len(s) > 0 and worst <= TOLERANCE, f"largest relative difference {worst:.2e}")
        peaks = {a: tagged(o, "PEAK") for a, (o, _, _) in outs.items()}
        if all(peaks.values()):
            self.peaks[name] = peaks
        return {a: (tagged(o, "METRICS"), tagged(o, "EXTRA")) for a, (o, _, _) in outs.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=",".join(ALL))
    ap.add_argument("--timeout", type=int, default=240, help="seconds per run")
    ap.add_argument("--budget", type=int, default=3600, help="runs not started within this many seconds are "
                    "reported as SKIP (not run), never silently")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    only = a.only.split(",")
    unknown = [o for o in only if o not in ALL]
    if unknown:
        sys.exit(f"--only: unknown {unknown}; known: {','.join(ALL)}")
    suite = Suite(a.out)
    started = time.time()
    skipped = []

    def due(name):
        if name not in only:
            return False
        if time.time() - started > a.budget:
            skipped.append(name)
            print(f"SKIP {name} (not run: past the {a.budget} s budget)", flush=True)
            return False
        return True

    if due("memory_api"):
        suite.script("memory_api", [os.path.join(HERE, "memory_api.py"), "--out", a.out], a.timeout)
    if due("contract"):   # PyTorch's contract: every check under PyTorch's allocator first, then under strata
        suite.script("contract-native", [os.path.join(HERE, "contract.py"), "--allocator", "native"], a.timeout)
        suite.script("contract", [os.path.join(HERE, "contract.py")], a.timeout)
    for mode in (m for m in TRAIN_MODES if due(m)):
        extra = suite.pair(mode, [os.path.join(HERE, "train_compare.py"), "--mode", mode], a.timeout)
        if mode == "graph" and extra:
            e = extra["strata"][1] or {}
            suite.record("graph: torch.cuda.MemPool under strata serves use_mem_pool",
                         e.get("pooled_sum") == float(1 << 20) and e.get("mempool_use_count", 0) >= 1, json.dumps(e))
    for fw in (f for f in FRAMEWORKS if due(f)):
        extra = suite.pair(fw, [os.path.join(HERE, "frameworks.py"), "--framework", fw], a.timeout)
        if extra:
            m = extra["strata"][0] or {}
            if fw == "trainer":
                suite.record("trainer: memory metrics reported under strata",
                             any(k.endswith("mem_gpu_alloc_delta") for k in m) and any("peaked" in k for k in m), json.dumps(m))
            else:
                suite.record("lightning: DeviceStatsMonitor logged torch.cuda.memory_stats under strata",
                             len(m.get("device_stats_columns", [])) >= 2, json.dumps(m))
    if due("mp_share"):
        suite.script("mp_share", [os.path.join(HERE, "mp_share.py")], max(a.timeout, 1200))  # a dozen spawned pairs
    failed = sum(1 for r in suite.results if not r["ok"])
    passed = len(suite.results) - failed
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"passed": passed, "failed": failed, "skipped": skipped, "results": suite.results, "peaks": suite.peaks},
                  f, indent=1)
    print(f"frameworks: {passed} passed, {failed} failed, {len(skipped)} not run", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
