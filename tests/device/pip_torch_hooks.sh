#!/usr/bin/env bash
# pip install . and PyTorch's hooks library, on a machine where PyTorch is installed (no network needed):
#   1. configured as pip configures it (SKBUILD=ON) with torch hidden from the build's interpreter the way pip's
#      build isolation hides the environment (a sitecustomize on PYTHONPATH that drops site-packages), CMake
#      still finds PyTorch (through `python -E`) and builds libstrata_torch_hooks.so;
#   2. pip install --no-build-isolation --no-deps into a scratch folder, without CMAKE_PREFIX_PATH, puts
#      libstrata_torch_hooks.so into the strata_torch package (needs scikit-build-core installed).
# Usage: tests/device/pip_torch_hooks.sh   (from the repository root; logs under $OUT, default ./pip-logs)
# Success: the last line says "pip_torch_hooks.sh: ALL PASSED".
set -uo pipefail
OUT=${OUT:-$PWD/pip-logs}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
unset CMAKE_PREFIX_PATH
py=$(command -v "${PYTHON:-python3}")
status=0
check() {  # name, then a command whose success is the check
  local name=$1; shift
  if "$@"; then echo "PASS $name"; else echo "FAIL $name (logs in $OUT)"; status=1; fi
}
"$py" -c 'import torch; print("torch", torch.__version__)' || { echo "pip_torch_hooks.sh: no PyTorch here"; exit 1; }

hide="$OUT/hide_site"
mkdir -p "$hide"
cat >"$hide/sitecustomize.py" <<'PY'
import site, sys
hidden = set(site.getsitepackages() + [site.getusersitepackages()])
sys.path[:] = [p for p in sys.path if p not in hidden]
PY
isolated() { PYTHONPATH="$hide" PYTHONNOUSERSITE=1 "$@"; }
check "torch hidden as pip's build isolation hides it" bash -c "! PYTHONPATH='$hide' PYTHONNOUSERSITE=1 '$py' -c 'import torch' 2>/dev/null"
isolated cmake -S . -B "$OUT/build" -DSKBUILD=ON -DPython_EXECUTABLE="$py" -DCMAKE_BUILD_TYPE=Release \
  -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_TOOLS=OFF \
  -DSTRATA_BUILD_CUDA=OFF -DSTRATA_BUILD_PLUGIN=ON >"$OUT/configure.log" 2>&1
check "configure finds PyTorch through the installing interpreter" grep -q "building libstrata_torch_hooks.so" "$OUT/configure.log"
isolated cmake --build "$OUT/build" -j"$(nproc)" --target strata_python_libs >"$OUT/build.log" 2>&1
check "libstrata_torch_hooks.so built" test -f "$OUT/build/plugin/libstrata_torch_hooks.so"

rm -rf "$OUT/site"
"$py" -m pip install --no-build-isolation --no-deps -v --target "$OUT/site" . >"$OUT/pip.log" 2>&1
check "pip install . puts libstrata_torch_hooks.so in strata_torch" test -f "$OUT/site/strata_torch/libstrata_torch_hooks.so"

if [ $status -eq 0 ]; then echo "pip_torch_hooks.sh: ALL PASSED"; else echo "pip_torch_hooks.sh: FAILED"; fi
exit $status
