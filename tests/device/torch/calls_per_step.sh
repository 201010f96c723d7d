#!/usr/bin/env bash
# What the plug-in's stack asks of CUDA per training step (train.py --mode perf: strata_calls_per_step), with
# the side copy stream on and off, each beside a native run: the diagnosis behind a speed difference.
#   MODEL=resnet18 ROUNDS=2 OUT=/tmp/strata-calls bash tests/device/torch/calls_per_step.sh
# Prints (and appends to $OUT/runs.txt) one line per process: label, median steps/s, peak reserved MiB and
# every nonzero count per step (events, stream_waits, host_waits, policy, relocations, page_*).
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/strata-calls}
MODEL=${MODEL:-resnet18}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
source tests/device/torch/build_plugin.sh
strata_build_plugin "$OUT/build.txt" || { echo "FAIL build: the plug-in did not build (see $OUT/build.txt)"; exit 1; }

# one ALLOC SIDE LABEL: one training process (SIDE 0: the batch copied on the main stream).
one() {
  STRATA_TEST_SIDE_STREAM=$2 python3 tests/device/torch/train.py --model "$MODEL" --alloc "$1" --mode perf \
    2>>"$OUT/err.txt" | tail -1 > "$OUT/last.json"
  python3 - "$OUT/last.json" "$3" <<'PY' | tee -a "$OUT/runs.txt"
import json, sys
d = json.load(open(sys.argv[1]))
calls = d.get("strata_calls_per_step", {})
print(sys.argv[2], d["model"], round(d["steps_per_s_median"], 2), "reserved_MiB", d["peak_reserved"] >> 20,
      " ".join(f"{k[len('strata.calls.'):]}={v:.2f}" for k, v in calls.items() if v))
PY
}
for ((r = 0; r < ROUNDS; r++)); do
  one strata 1 "strata side"; one native 1 "native side"
  one strata 0 "strata noside"; one native 0 "native noside"
done
