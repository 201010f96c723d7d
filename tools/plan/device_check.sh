#!/usr/bin/env bash
# strata-plan --device on a GPU machine (the coordinator's check; no GPU is needed for anything else in
# tools/plan). Builds strata-plan, replays every shipped trace on simulated memory and on the GPU through the
# real default_pool and cudaMalloc, and checks that the GPU replays ran to the end with the same peak live as
# the simulated ones. Logs and JSON reports go to $OUT (default ./plan-device-out).
# Prints one PASS/FAIL line per trace and a summary; exit code 0 only when every trace passed.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/plan-device-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
if ! { cmake -S . -B build-plan-device -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_EXAMPLES=OFF \
         -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_PLUGIN=OFF >"$OUT/configure.log" 2>&1 &&
       cmake --build build-plan-device -j"$(nproc)" --target strata-plan >"$OUT/build.log" 2>&1; }; then
  echo "FAIL: build (see $OUT/configure.log, $OUT/build.log)"
  exit 1
fi
nvidia-smi --query-gpu=name,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
pass=0
fail=0
for trace in bench/traces/*.csv.gz; do
  name=$(basename "$trace" .csv.gz)
  build-plan-device/tools/plan/strata-plan "$trace" --capacity H100-80GB --device --no-progress \
    --json "$OUT/$name.json" --html "$OUT/$name.html" >"$OUT/$name.log" 2>&1
  rc=$?
  if python3 - "$OUT/$name.json" "$rc" <<'PY'; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
import json, sys
path, rc = sys.argv[1], int(sys.argv[2])
name = path.rsplit("/", 1)[-1]
try:
    trace = json.load(open(path))["traces"][0]
except Exception as e:
    print(f"FAIL {name}: strata-plan exit {rc}, no report ({e})"); sys.exit(1)
gpu = trace.get("gpu")
if rc != 0 or gpu is None:
    print(f"FAIL {name}: strata-plan exit {rc}, GPU replay {'missing (no GPU found?)' if gpu is None else 'present'}"); sys.exit(1)
sim = {s["name"]: s for s in trace["stacks"]}
ok = True
for g in gpu["stacks"]:
    twin = sim["default_pool" if g["name"].startswith("default_pool") else "cudamalloc"]
    same_live = g["peak_live"] == twin["peak_live"]
    ok &= g["failure"] is None and same_live
    print(f"  {g['name']}: peak live {g['peak_live']} (simulated {twin['peak_live']}), peak reserved {g['peak_reserved']} "
          f"(simulated {twin['peak_reserved']}, {100.0 * (g['peak_reserved'] / twin['peak_reserved'] - 1):+.2f}%), "
          f"{g['ns_per_op']:.0f} ns/op, failure: {g['failure']}")
print(f"{'PASS' if ok else 'FAIL'} {name} on {gpu['device']}")
sys.exit(0 if ok else 1)
PY
done
echo "strata-plan --device: $pass passed, $fail failed (logs in $OUT)"
[ "$fail" -eq 0 ]
