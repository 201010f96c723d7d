"""DDP and FSDP2 on two GPUs, under PyTorch's allocator and under strata's backend: each mode runs ROUNDS
rounds, each round one native and one strata torchrun back to back (the order alternating by round, so drift
hits both alike). Checks per mode: every run ends, strata's losses equal native's (relative 1e-4; the runs differ
only in addresses), torch.cuda reports strata's backend under strata, and strata's peak reserved over peak
allocated is no worse than native's on every rank. Reports the peaks per rank and the median over rounds of
the same-round steps/s ratio strata/native with its range.
    python3 tests/device/frameworks/distributed_run.py --out DIR [--rounds 2] [--steps 24] [--modes ddp,fsdp2]
Writes DIR/distributed.json and DIR/distributed.log; prints PASS/FAIL lines and a count; exit 1 on a failure.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = 1e-4


def relative_difference(expected, got):
    """The largest relative difference between two loss curves; infinite when their lengths differ."""
    if len(expected) != len(got) or not expected:
        return float("inf")
    return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(expected, got))


def run(alloc, mode, steps, log, timeout):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(HERE, "distributed.py"), "--allocator", alloc, "--mode", mode, "--steps", str(steps)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = str(e.stdout or ""), str(e.stderr or "") + "\nTIMEOUT", 124
    log.write(f"===== {mode} under {alloc} (exit {rc})\n{out}\n--- stderr\n{err[-6000:]}\n")
    log.flush()
    lines = [l for l in out.splitlines() if l.startswith("{")]
    return (json.loads(lines[-1]) if rc == 0 and lines else None), err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--modes", default="ddp,fsdp2")
    ap.add_argument("--timeout", type=int, default=180)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "distributed.log"), "w")
    results, checks = {}, []

    def check(name, ok, detail=""):
        checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} {name}" + (f" ({detail})" if detail else ""), flush=True)

    for mode in a.modes.split(","):
        rounds = []
        for r in range(a.rounds):
            order = ("native", "strata") if r % 2 == 0 else ("strata", "native")
            got = {}
            for alloc in order:
                got[alloc], err = run(alloc, mode, a.steps, log, a.timeout)
                check(f"{mode} round {r}: runs to the end under {alloc}", got[alloc] is not None,
                      "" if got[alloc] else err.strip()[-800:])
            rounds.append(got)
        done = [g for g in rounds if g["native"] and g["strata"]]
        results[mode] = rounds
        if not done:
            continue
        worst = max(relative_difference(g["native"]["losses"], g["strata"]["losses"]) for g in done)
        steps = {len(g[a]["losses"]) for g in done for a in ("native", "strata")}
        check(f"{mode}: strata's losses equal PyTorch's allocator's in every round ({len(done)} rounds)",
              steps == {a.steps} and worst <= TOLERANCE, f"largest relative difference {worst:.2e}")
        check(f"{mode}: torch.cuda names strata's backend under strata",
              all(g["strata"]["backend"] == "strata" for g in done), done[0]["strata"]["backend"])
        ratios = [{k: [g[k]["peak_reserved"][i] / g[k]["peak_allocated"][i] for i in range(2)] for k in ("native", "strata")}
                  for g in done]
        check(f"{mode}: strata's peak reserved / allocated no worse than native's on each rank in every round",
              all(r["strata"][i] <= r["native"][i] for r in ratios for i in range(2)),
              f"native {ratios[0]['native'][0]:.3f} / {ratios[0]['native'][1]:.3f}, "
              f"strata {ratios[0]['strata'][0]:.3f} / {ratios[0]['strata'][1]:.3f} (first round)")
        speed = [g["strata"]["steps_per_s"] / g["native"]["steps_per_s"] for g in done]
        print(f"SPEED {mode}: strata/native steps/s median {statistics.median(speed):.3f} over {len(speed)} rounds "
              f"(range {min(speed):.3f}-{max(speed):.3f}); native {statistics.median(g['native']['steps_per_s'] for g in done):.2f} "
              f"steps/s, strata {statistics.median(g['strata']['steps_per_s'] for g in done):.2f}", flush=True)
    failed = sum(1 for c in checks if not c["ok"])
    with open(os.path.join(a.out, "distributed.json"), "w") as f:
        json.dump({"passed": len(checks) - failed, "failed": failed, "checks": checks, "runs": results}, f, indent=1)
    print(f"distributed: {len(checks) - failed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
