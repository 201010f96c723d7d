#!/usr/bin/env bash
# The device checks of the plug-in and the library in one machine session, longer than one device command may
# last: `start` launches them detached from the calling command (setsid), so they outlive it, and returns at
# once; each later `wait` command watches them for up to N seconds and packs what they wrote into
# $OUT/lanes.tar.gz. The machine must be kept (a `wait` call soon after the last) until `done: yes`.
#
#   bash tests/device/lanes.sh start [STEPS]     (from the repository root)
#   bash tests/device/lanes.sh wait 560
#
# STEPS, a comma list (default cuda,trees,frameworks,graph_memory,plugin,ctest), run one after the other on the
# GPU in this order, never two at once (the PyTorch suite's memory tests read what the GPU and the process hold):
#   traces        bench/record_traces.py for the workloads in $TRACES (default: every one), before the rest
#   cuda          PyTorch's test_cuda.py selection under strata (pytorch_suite/run.sh --set cuda --modes strata)
#   trees         test_cudagraph_trees.py under strata
#   native        both files natively too, before the strata runs
#   frameworks    the frameworks suite's memory API and contract (ONLY=memory_api,contract frameworks/run.sh)
#   graph_memory  graph-pool peak reserved on three models, under reduce-overhead and torch.cuda.graph
#                 (torch/graph_pool_memory.py)
#   rmm           RMM's memory-resource tests over strata's stacks (tests/rmm/run.sh), then bench/rmm_interop.sh:
#                 the programs tests/rmm/build.sh made, from $STRATA_RMM_BIN (default .rmm_tests/build/bin)
#   plugin        tests/device/plugin.sh
#   ctest         the whole test suite with STRATA_REQUIRE_GPU=1, then the GPU suite alone
#   trace_speed   bench/trace_speed.sh: default_pool against PyTorch's allocator on every trace (ROWS, REPEATS)
#   speed         tests/device/torch/speed_verdict.sh with $SPEED_MODELS (default bert_varlen mixtral_moe
#                 gpt2_generate), $SPEED_ROUNDS (3) and $SPEED_STEPS (24)
#   fits          bench/fits.py with the arguments in $FITS_ARGS (the cap study; --out is given), last
# Meanwhile the CPU builds what plugin and ctest need (the main build with PyTorch's CMake package, so the
# PyTorch hooks library and the Python package's tests are in it), at the lowest priority, so that the
# timing-sensitive tests on the GPU meanwhile are not starved. The plug-in for the PyTorch runs comes from
# build-device-torch/ when its stamp matches (torch/prebuild_plugin.sh), else it is built first. Results and
# logs: /tmp/strata-lanes (progress.txt says what finished, with each exit status).
set -uo pipefail
self=$(realpath "$0")
cd "$(dirname "$self")/../.."
R=/tmp/strata-lanes
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
mode=${1:-}

pack() {
  [ -n "${OUT:-}" ] && tar czf "$OUT/lanes.tar.gz" -C "$(dirname "$R")" "$(basename "$R")" 2>/dev/null
  return 0
}
note() { echo "$(date +%T) $*" >>"$R/progress.txt"; }

cpu_builds() {
  local prefix doctest=()
  prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  # Without doctest installed, its header at .device/doctest/doctest.h (carried) serves.
  [ ! -e /usr/include/doctest/doctest.h ] && [ -e .device/doctest/doctest.h ] && doctest=(-DSTRATA_DOCTEST_INCLUDE="$PWD/.device")
  note "cpu: builds start"
  renice -n 19 -p "$BASHPID" >/dev/null 2>&1  # this background subshell only, not the GPU steps
  { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_BENCH=OFF \
      ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} "${doctest[@]}" && cmake --build build -j12; } >"$R/main_build.log" 2>&1
  note "cpu: main build rc=$?"
  { cmake -S . -B build-plugin -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_CUDA=ON \
      -DSTRATA_BUILD_PLUGIN=ON -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_TOOLS=OFF \
      ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} "${doctest[@]}" &&
    cmake --build build-plugin -j12 --target strata_alloc strata_plugin_unit_tests strata_plugin_c_api_tests \
      strata_plugin_gpu_tests ${prefix:+strata_torch_hooks}; } >"$R/plugin_build.log" 2>&1
  note "cpu: plug-in build rc=$?"
  touch "$R/cpu_done"
}

gpu_steps() {
  local steps=",$1,"
  has() { [[ "$steps" == *",$1,"* ]]; }
  source tests/device/torch/build_plugin.sh
  strata_build_plugin "$R/plugin_for_torch.txt"
  note "gpu: plug-in for PyTorch rc=$? ($(tail -1 "$R/plugin_for_torch.txt"))"
  local modes=strata
  has native && modes=native,strata
  # A strata run alone ends with status 5 (no native results beside it to compare with): compare.py then
  # judges it against an archived native run.
  suite() {  # name, set, budget
    local rc
    tests/device/pytorch_suite/run.sh --set "$2" --modes "$modes" --budget "$3" --out "$R/suite" >"$R/$1.out" 2>&1
    rc=$?
    [ "$rc" = 5 ] && [ "$modes" = strata ] && rc=0
    note "gpu: $2 rc=$rc ($(grep -m1 -E '^(PASS|FAIL):' "$R/$1.out"))"
  }
  if has traces; then
    python3 bench/record_traces.py --out "$R/traces" ${TRACES:+--workloads "$TRACES"} >"$R/traces.out" 2>&1
    note "gpu: record_traces rc=$? ($(ls "$R"/traces/*.csv.gz 2>/dev/null | wc -l) traces)"
  fi
  has cuda && suite cuda cuda 260
  has trees && suite trees cudagraph_trees 150
  if has frameworks; then
    ONLY=memory_api,contract OUT="$R/frameworks" bash tests/device/frameworks/run.sh >"$R/frameworks.out" 2>&1
    note "gpu: frameworks rc=$? ($(tail -1 "$R/frameworks.out"))"
  fi
  if has graph_memory; then
    mkdir -p "$R/graph_memory"
    python3 tests/device/torch/graph_pool_memory.py --modes compile-ro,graph --out "$R/graph_memory" >"$R/graph_memory.out" 2>&1
    note "gpu: graph_pool_memory rc=$? ($(tail -1 "$R/graph_memory.out"))"
  fi
  if has rmm; then
    bash tests/rmm/run.sh "$R/rmm" >"$R/rmm.out" 2>&1
    note "gpu: rmm tests rc=$? ($(tail -1 "$R/rmm.out"))"
    bash bench/rmm_interop.sh "$R/rmm/rmm_interop.txt" >"$R/rmm_interop.out" 2>&1
    note "gpu: rmm_interop rc=$? ($(tail -1 "$R/rmm_interop.out"))"
  fi
  if has plugin || has ctest; then
    local waited=0
    while [ ! -f "$R/cpu_done" ] && [ "$waited" -lt 1800 ]; do sleep 2; waited=$((waited + 2)); done
    [ -f "$R/cpu_done" ] || note "gpu: the builds did not finish in 1800 s"
  fi
  if has plugin; then
    BUILD=build-plugin OUT="$R/plugin" bash tests/device/plugin.sh >"$R/plugin.out" 2>&1
    note "gpu: plugin.sh rc=$? ($(tail -1 "$R/plugin.out"))"
  fi
  if has ctest; then
    STRATA_REQUIRE_GPU=1 ctest --test-dir build -j4 --timeout 300 --output-on-failure >"$R/ctest.log" 2>&1
    note "gpu: ctest rc=$? ($(grep 'tests passed' "$R/ctest.log"))"
    STRATA_REQUIRE_GPU=1 build/tests/strata_gpu_tests >"$R/gpu_tests.log" 2>&1
    note "gpu: strata_gpu_tests rc=$? ($(grep -E '^\[doctest\] test cases' "$R/gpu_tests.log"))"
  fi
  if has trace_speed; then
    OUT="$R/trace_speed" bash bench/trace_speed.sh >"$R/trace_speed.out" 2>&1
    note "gpu: trace_speed rc=$? ($(grep -m1 'against torch' "$R/trace_speed/verdict.md" 2>/dev/null))"
  fi
  if has speed; then
    OUT="$R/speed" MODELS="${SPEED_MODELS:-bert_varlen mixtral_moe gpt2_generate}" ROUNDS="${SPEED_ROUNDS:-3}" STEPS="${SPEED_STEPS:-24}" \
      BUDGET_S="${SPEED_BUDGET_S:-600}" bash tests/device/torch/speed_verdict.sh >"$R/speed.out" 2>&1
    note "gpu: speed_verdict rc=$? ($(grep -c . "$R/speed/runs.jsonl" 2>/dev/null) processes)"
  fi
  if has fits; then
    mkdir -p "$R/fits"
    # shellcheck disable=SC2086  # FITS_ARGS is a list of arguments
    python3 bench/fits.py ${FITS_ARGS:-} --out "$R/fits" >"$R/fits.out" 2>&1
    note "gpu: fits rc=$?"
  fi
}

case "$mode" in
  start)
    if [ -f "$R/lanes.pid" ] && kill -0 "$(cat "$R/lanes.pid")" 2>/dev/null && [ ! -f "$R/done" ]; then
      echo "lanes already running (pid $(cat "$R/lanes.pid")): wait for them, or kill that process group first" >&2
      exit 3
    fi
    if [[ ",${2:-}," == *,fits,* && -z "${FITS_ARGS:-}" ]]; then
      echo "the fits step needs FITS_ARGS (bench/fits.py's caps, models and starts): its defaults search for hours" >&2
      exit 4
    fi
    rm -rf "$R"
    mkdir -p "$R"
    { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
      python3 -c 'import torch; print("torch", torch.__version__, torch.version.git_version)'; } >"$R/device.txt" 2>&1
    setsid nohup bash "$self" lanes "${2:-cuda,trees,frameworks,graph_memory,plugin,ctest}" >"$R/lanes.log" 2>&1 </dev/null &
    echo $! >"$R/lanes.pid"
    sleep 2
    cat "$R/device.txt"
    if ! kill -0 "$(cat "$R/lanes.pid")" 2>/dev/null && [ ! -f "$R/done" ]; then
      echo "the lanes did not start: $R/lanes.log says" >&2
      cat "$R/lanes.log" >&2
      exit 1
    fi
    echo "started; progress in $R/progress.txt"
    ;;
  lanes)
    if [[ ",$2," == *,plugin,* || ",$2," == *,ctest,* ]]; then cpu_builds & fi
    gpu_steps "$2"
    wait
    note "done"
    touch "$R/done"
    ;;
  wait)
    n=${2:-560} t=0
    while [ "$t" -lt "$n" ] && [ ! -f "$R/done" ]; do sleep 5; t=$((t + 5)); done
    echo "waited $t s; done: $([ -f "$R/done" ] && echo yes || echo no)"
    cat "$R/progress.txt" 2>/dev/null
    pack
    # Done with a step that failed: exit 1, so that the caller sees it without reading the list.
    [ -f "$R/done" ] && grep -q " rc=[1-9]" "$R/progress.txt" && exit 1
    exit 0
    ;;
  *)
    sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 4
    ;;
esac
