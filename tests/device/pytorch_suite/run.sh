#!/usr/bin/env bash
# PyTorch's own tests as the judge of strata's PyTorch backend, on a GPU machine (PyTorch 2.11, pytest; no
# network). Runs one selection of PyTorch's test files twice, one run after the other on the same GPU: natively
# (PyTorch's caching allocator), then under strata (strata_site/sitecustomize.py calls
# strata_torch.enable(CONF) in every Python process before CUDA starts). Each run writes junit XML and a
# test-by-test record; compare.py then lists every test that passed natively and did not pass under strata,
# honouring known_exceptions.txt.
#
#   tests/device/pytorch_suite/run.sh --set cuda --split 1/3 --out "$OUT"     (from the repository root)
#   tests/device/pytorch_suite/run.sh --build-only --out "$OUT"               (build, check, count the tests)
#
# Options:
#   --set NAME          cuda | cudagraph_trees | multigpu: a file and the -k selection of its memory tests
#                       (streams, graphs, MemPool, IPC, out of memory, statistics, snapshots, memory history)
#   --files "F ..."     test files, relative to the tests tree (instead of --set's file)
#   -k EXPR             pytest's -k selection (instead of --set's); -k '' selects every test of the files
#   --split I/N         run the I-th of N parts of the selection (suite_plugin.py); both runs take the same part
#   --budget S          per run: start no test after S seconds (default 200), so pytest still writes its XML
#   --run-timeout S     per run: kill it after S seconds (default budget + 60); its record still counts
#   --test-timeout S    per test, through pytest-timeout where installed (default 180)
#   --modes M,M         native,strata (default), or one of them
#   --conf CONF         strata's configuration (default stack=default)
#   --tests DIR         the tree holding PyTorch's test/ folder (default .pytorch_tests; README.md says how
#                       to place it)
#   --label NAME        names this part's files (default: the set and split, e.g. cuda-1of3)
#   --out DIR           where LABEL.tar.gz (everything) and LABEL.comparison.txt go (default $OUT, else
#                       /tmp/strata-pytorch-suite/out)
#   --collect           list the selected tests (natively, nothing run) and stop
#   --build-only        build the plug-in, check that strata becomes PyTorch's allocator, count the tests of
#                       every set, and stop
# Exit status: compare.py's (0: every native pass passed under strata or is a listed exception; 1: regressions;
# 2: unreadable results), 3 when the build, the test tree or the strata check failed, 4 for bad arguments,
# 5 when only one run's results are there (the other mode runs in a later call with the same --label).
set -uo pipefail
cd "$(dirname "$0")/../../.."
REPO=$PWD
SUITE=$REPO/tests/device/pytorch_suite

# The memory parts of each file, by pytest -k keyword (a test matches when a word occurs in its name, its
# class's or its file's, ignoring case). Whole classes about memory are named; the rest are picked by words.
K_CUDA="memory or mem_ or mempool or alloc or cach or pool or oom or stream or event or graph or snapshot \
or history or stats or fraction or expandable or segment or ipc or record or leak or BlockStateAbsorption \
or CudaMallocAsync or plot or viz or cycles or trace"
K_MULTIGPU="memory or mem_ or mempool or alloc or cach or pool or oom or stream or event or graph or snapshot \
or stats or fraction or ipc or record or empty"
set_files() {
  case "$1" in
    cuda) echo test/test_cuda.py ;;
    cudagraph_trees) echo test/inductor/test_cudagraph_trees.py ;;
    multigpu) echo test/test_cuda_multigpu.py ;;
    *) return 1 ;;
  esac
}
set_k() {
  case "$1" in
    cuda) echo "$K_CUDA" ;;
    cudagraph_trees) echo "" ;;   # every test of the file exercises graph pools
    multigpu) echo "$K_MULTIGPU" ;;
  esac
}

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 4; }
SET="" FILES="" K="" K_GIVEN=0 SPLIT="" BUDGET=200 RUN_TIMEOUT="" TEST_TIMEOUT=180 MODES=native,strata
CONF=stack=default TESTS=.pytorch_tests LABEL="" OUTDIR=${OUT:-/tmp/strata-pytorch-suite/out} COLLECT=0 BUILD_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --set) SET=$2; shift ;;
    --files) FILES=$2; shift ;;
    -k) K=$2; K_GIVEN=1; shift ;;
    --split) SPLIT=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --run-timeout) RUN_TIMEOUT=$2; shift ;;
    --test-timeout) TEST_TIMEOUT=$2; shift ;;
    --modes) MODES=$2; shift ;;
    --conf) CONF=$2; shift ;;
    --tests) TESTS=$2; shift ;;
    --label) LABEL=$2; shift ;;
    --out) OUTDIR=$2; shift ;;
    --collect) COLLECT=1 ;;
    --build-only) BUILD_ONLY=1 ;;
    -h|--help) usage ;;
    *) echo "run.sh: unknown argument '$1' (--help lists them)" >&2; exit 4 ;;
  esac
  shift
done
WORK=""
# Everything of this part in one file under OUTDIR, also when a step failed (the build log says why).
pack() { [ -n "$WORK" ] && [ -d "$WORK" ] && tar -czf "$OUTDIR/$LABEL.tar.gz" -C "$(dirname "$WORK")" "$LABEL"; }
die() { echo "run.sh: $1" >&2; pack; exit "${2:-4}"; }
if [ -n "$SET" ]; then
  set_files "$SET" >/dev/null || die "--set '$SET': expected cuda, cudagraph_trees or multigpu"
  [ -n "$FILES" ] || FILES=$(set_files "$SET")
  [ "$K_GIVEN" = 1 ] || K=$(set_k "$SET")
fi
[ -n "$FILES" ] || [ "$BUILD_ONLY" = 1 ] || die "name the tests: --set NAME or --files \"F ...\""
[[ -z "$SPLIT" || "$SPLIT" =~ ^[0-9]+/[0-9]+$ ]] || die "--split '$SPLIT': expected I/N"
[[ "$BUDGET" =~ ^[0-9]+$ && "$TEST_TIMEOUT" =~ ^[0-9]+$ ]] || die "--budget and --test-timeout take whole seconds"
RUN_TIMEOUT=${RUN_TIMEOUT:-$((BUDGET + 60))}
[[ "$RUN_TIMEOUT" =~ ^[0-9]+$ ]] || die "--run-timeout takes whole seconds"
for m in ${MODES//,/ }; do [[ "$m" == native || "$m" == strata ]] || die "--modes: '$m' is neither native nor strata"; done
if [ -z "$LABEL" ]; then
  LABEL=${SET:-files}
  [ "$BUILD_ONLY" = 0 ] || LABEL=build
  [ -z "$SPLIT" ] || LABEL="$LABEL-${SPLIT%/*}of${SPLIT#*/}"
fi
[[ "$LABEL" =~ ^[A-Za-z0-9._-]+$ ]] || die "--label '$LABEL': letters, digits, '.', '_' and '-' only"
case "$TESTS" in /*) ;; *) TESTS=$REPO/$TESTS ;; esac
for f in $FILES; do
  [ -f "$TESTS/$f" ] || die "$TESTS/$f is missing: place PyTorch 2.11's test files as tests/device/pytorch_suite/README.md says" 3
done

# A part's files stay in WORK across calls on one machine, so its native and strata runs may be two calls.
WORK=/tmp/strata-pytorch-suite/$LABEL
mkdir -p "$WORK" "$OUTDIR"
export PYTHONUNBUFFERED=1
unset PYTORCH_CUDA_ALLOC_CONF STRATA_SUITE_CONF
# Only the CUDA instantiations of PyTorch's device-generic tests: the CPU ones say nothing about an allocator.
export PYTORCH_TESTING_DEVICE_ONLY_FOR=cuda

# expecttest (imported by torch.testing._internal) is not installed on the device: its wheel travels in .whl/.
SITE=/tmp/strata-pytorch-suite/site
if ! PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} python3 -c 'import expecttest' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$REPO"/.whl/expecttest*.whl || die "expecttest is not installed and its wheel is not in .whl/ (README.md)" 3
fi
BASE_PYTHONPATH=$SUITE:$SITE${PYTHONPATH:+:$PYTHONPATH}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | paste -sd';')"
  echo "python: $(python3 -c 'import sys, torch, pytest; print(sys.version.split()[0], "torch", torch.__version__, torch.version.git_version, "pytest", pytest.__version__)' 2>&1)"
  echo "strata configuration: $CONF"
  echo "test files (sha256):"
  for f in $FILES; do echo "  $(sha256sum "$TESTS/$f" | cut -d' ' -f1)  $f"; done
  echo "selection: -k '$K'  split: ${SPLIT:-whole}  budget: ${BUDGET}s  run timeout: ${RUN_TIMEOUT}s  test timeout: ${TEST_TIMEOUT}s"
} >>"$WORK/env.txt"

build_strata() {
  source "$REPO/tests/device/torch/build_plugin.sh"
  strata_build_plugin "$WORK/build.txt" || { tail -30 "$WORK/build.txt"; die "the plug-in did not build (build.txt)" 3; }
  # The check every strata run relies on: with sitecustomize.py on the path, a fresh process serves its first
  # tensor from strata's backend.
  local backend
  backend=$(STRATA_SUITE_CONF=$CONF PYTHONPATH=$SUITE/strata_site:$REPO/python:$BASE_PYTHONPATH python3 -c \
    'import torch; torch.empty(1, device="cuda"); print(torch.cuda.memory.get_allocator_backend())' 2>>"$WORK/build.txt")
  echo "allocator backend under strata_site: ${backend:-none}" | tee -a "$WORK/env.txt"
  [ "$backend" = strata ] || { tail -20 "$WORK/build.txt"; die "strata did not become PyTorch's allocator (build.txt)" 3; }
}

timeout_opt=()
python3 -c 'import pytest_timeout' 2>/dev/null && timeout_opt=(--timeout="$TEST_TIMEOUT")
[ ${#timeout_opt[@]} -gt 0 ] || echo "pytest-timeout is not installed: no per-test timeout" | tee -a "$WORK/env.txt"

# pytest ARGS... in the tests tree, with neither a configuration file nor a cache written there.
pytest_in_tree() {
  (cd "$TESTS" && python3 -m pytest -c /dev/null --rootdir=. -p no:cacheprovider -p suite_plugin "$@")
}
selection=($FILES)
[ -z "$K" ] || selection+=(-k "$K")
[ -z "$SPLIT" ] || selection+=(--suite-split "$SPLIT")

if [ "$BUILD_ONLY" = 1 ] || [[ ",$MODES," == *,strata,* && "$COLLECT" = 0 ]]; then
  build_strata   # first, so a failing build costs no native run
fi
if [ "$BUILD_ONLY" = 1 ]; then
  for s in cuda cudagraph_trees multigpu; do
    f=$(set_files "$s"); k=$(set_k "$s")
    [ -f "$TESTS/$f" ] || { echo "$s: $f is not in $TESTS"; continue; }
    n=$(PYTHONPATH=$BASE_PYTHONPATH pytest_in_tree --collect-only -q "$f" ${k:+-k "$k"} 2>&1 | grep -c '::')
    echo "$s: $n tests selected ($f)"
  done
  # Parts started side by side (one GPU each, CUDA_VISIBLE_DEVICES) use this build instead of each building.
  echo "export STRATA_ALLOC_LIBRARY=$STRATA_ALLOC_LIBRARY"
  pack
  exit 0
fi
if [ "$COLLECT" = 1 ]; then
  PYTHONPATH=$BASE_PYTHONPATH pytest_in_tree --collect-only -q "${selection[@]}"
  exit $?
fi

for mode in ${MODES//,/ }; do
  rm -f "$WORK/$mode".*
  args=("${selection[@]}" -q -rfE --tb=short --junitxml="$WORK/$mode.xml" --suite-record "$WORK/$mode.jsonl"
        --suite-budget "$BUDGET" "${timeout_opt[@]}")
  # Each run compiles into its own inductor cache, so neither finds the other's kernels ready.
  export TORCHINDUCTOR_CACHE_DIR=/tmp/strata-pytorch-suite/inductor-$mode
  if [ "$mode" = strata ]; then
    path=$SUITE/strata_site:$REPO/python:$BASE_PYTHONPATH
    args+=(--suite-expect-strata)
    conf=$CONF
  else
    path=$BASE_PYTHONPATH
    conf=""
  fi
  printf '%s\n' "cd $TESTS && $(printf '%q ' STRATA_SUITE_CONF="$conf" PYTHONPATH="$path" timeout -k 20 "$RUN_TIMEOUT" \
    python3 -m pytest -c /dev/null --rootdir=. -p no:cacheprovider -p suite_plugin "${args[@]}")" >>"$WORK/commands.txt"
  start=$(date +%s)
  STRATA_SUITE_CONF=$conf PYTHONPATH=$path timeout -k 20 "$RUN_TIMEOUT" \
    bash -c 'cd "$0" && exec python3 -m pytest -c /dev/null --rootdir=. -p no:cacheprovider -p suite_plugin "$@"' \
    "$TESTS" "${args[@]}" >"$WORK/$mode.log" 2>&1
  rc=$?
  echo "$mode: pytest exit $rc after $(( $(date +%s) - start )) s$( [ "$rc" -ge 124 ] && echo ' (killed at the run timeout)')" \
    | tee -a "$WORK/env.txt"
  tail -n 3 "$WORK/$mode.log"
  gzip -f "$WORK/$mode.log"
done

# The results of a run: its junit XML, else (pytest killed before writing it) its test-by-test record.
results_of() {
  if [ -s "$WORK/$1.xml" ]; then echo "$WORK/$1.xml"; elif [ -f "$WORK/$1.jsonl" ]; then echo "$WORK/$1.jsonl"; fi
}
native=$(results_of native) strata=$(results_of strata)
rc=0
rm -f "$WORK/comparison.txt" "$OUTDIR/$LABEL.comparison.txt"
if [ -n "$native" ] && [ -n "$strata" ]; then
  python3 "$SUITE/compare.py" --native "$native" --strata "$strata" --exceptions "$SUITE/known_exceptions.txt" \
    --report "$WORK/comparison.txt" >/dev/null
  rc=$?
  [ -f "$WORK/comparison.txt" ] && { tail -n 40 "$WORK/comparison.txt"; cp "$WORK/comparison.txt" "$OUTDIR/$LABEL.comparison.txt"; }
else
  echo "$LABEL: only the ${native:+native}${strata:+strata} run's results are here; the comparison waits for the other"
  rc=5
fi
pack
echo "results: $OUTDIR/$LABEL.tar.gz"
exit $rc
