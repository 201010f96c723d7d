#!/usr/bin/env bash
# The PyTorch/CuPy checks on a GPU machine (PyTorch 2.11, CuPy 14, CUDA 13, no network needed).
#   bash tests/device/torch.sh            # builds the plug-in with CMake, uses it via STRATA_ALLOC_LIBRARY
#   STRATA_PY_INSTALL=pip bash tests/device/torch.sh   # instead: pip install --no-build-isolation --no-deps .
#   ONLY=unit,correctness,perf bash tests/device/torch.sh   # a subset of unit,correctness,perf,oom,examples,memcheck
#   ONLY=frameworks bash tests/device/torch.sh               # the frameworks suite (not in the default set)
# The whole set may take longer than one 10-minute device call (the build comes on top): then run it
# as two calls, ONLY=unit,correctness,perf then ONLY=oom,examples,memcheck (the build tree is reused).
# Parts not started within BUDGET_S seconds (default 400) are reported as SKIP "(not run)", never silently.
# Writes $OUT/results.json, $OUT/memory.md (the memory/speed table), $OUT/log.txt (every run's output),
# $OUT/build.txt. Prints PASS/FAIL/SKIP per check; exits non-zero if any FAIL.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/strata-torch-device}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
# PyTorch's CMake package, so the plug-in's CMake also builds the hooks library (libstrata_torch_hooks.so).
TORCH_PREFIX=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null) &&
  export CMAKE_PREFIX_PATH=$TORCH_PREFIX${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
if [[ "${STRATA_PY_INSTALL:-cmake}" == pip ]]; then
  python3 -m pip install --no-build-isolation --no-deps --target /tmp/strata-py-site . >"$OUT/build.txt" 2>&1 \
    || { echo "FAIL build: pip install (see build.txt)"; tail -30 "$OUT/build.txt"; exit 1; }
  export PYTHONPATH=/tmp/strata-py-site${PYTHONPATH:+:$PYTHONPATH}
  unset STRATA_ALLOC_LIBRARY
else
  source tests/device/torch/build_plugin.sh
  strata_build_plugin "$OUT/build.txt" \
    || { echo "FAIL build: the plug-in did not build (see build.txt)"; tail -30 "$OUT/build.txt"; exit 1; }
fi
echo "PASS build"
# The host tests of the Python module, now with torch and a GPU: nothing may skip.
if [[ -z "${ONLY:-}" || ",$ONLY," == *,unit,* ]]; then
  STRATA_REQUIRE_GPU=1 python3 -m unittest discover -s python/tests >"$OUT/log.txt.unit" 2>&1 \
    && echo "PASS python unit tests (STRATA_REQUIRE_GPU=1)" \
    || { echo "FAIL python unit tests"; tail -40 "$OUT/log.txt.unit"; unit_failed=1; }
fi
rest=${ONLY:-correctness,perf,oom,examples,memcheck}
rest=$(echo ",$rest," | sed 's/,unit,/,/; s/,frameworks,/,/; s/^,//; s/,$//')
rc=0
if [[ -n "$rest" ]]; then
  python3 tests/device/torch/run_all.py --out "$OUT" --only "$rest"
  rc=$?
fi
# strata's PyTorch backend under the torch.cuda memory API and real frameworks (tests/device/frameworks/).
if [[ ",${ONLY:-}," == *,frameworks,* ]]; then
  python3 tests/device/frameworks/run_all.py --out "$OUT/frameworks" || rc=1
fi
cat "$OUT/log.txt.unit" >>"$OUT/log.txt" 2>/dev/null; rm -f "$OUT/log.txt.unit"
exit $(( rc || ${unit_failed:-0} ))
