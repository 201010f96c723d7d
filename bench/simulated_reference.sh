#!/usr/bin/env bash
# The simulated reference run, the source of every figure in README.md and docs/ that needs no GPU
# (docs/results/simulated/). On any machine with the CUDA toolkit, from anywhere:
#   bench/simulated_reference.sh OUT_DIR [BUILD_DIR]
# BUILD_DIR (default build) must be configured; the script builds what it runs: bench/mapped_variants.sh
# (mapped_pool's design points, every stack of bench/replay on every trace at x0.9, x1.0 and x1.1), where
# default_pool's memory above live sits at Llama generation's peak (llama_peak/), strata-plan on every shipped
# trace (planner/: docs/planner.md's table), and the memory map viewer's
# pages in headless Chromium (viewer/: the log and the screenshots docs/viewer.md shows). Each step's exit
# status goes to OUT_DIR/status.txt; the script exits 1 if any failed.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:?output folder}" && cd "$1" && pwd)
build=$(cd "${2:-build}" && pwd)
cd "$root"
failed=0
cmake --build "$build" -j2 --target mapped_variants replay strata-plan strata-view strata_viewer_tests \
      strata_viewer_snapshot_fixture || exit 1
bench/mapped_variants.sh "$out" "$build" || failed=1

mkdir -p "$out/llama_peak"
for scale in 0.9 1.0 1.1; do
  "$build/tools/plan/strata-plan" bench/traces/llama_generate.csv.gz --stacks default_pool --scale "$scale" \
    --json "$out/llama_peak/plan-x$scale.json" --no-progress > "$out/llama_peak/plan-x$scale.txt" || failed=1
done
python3 bench/peak_holes.py "$out"/llama_peak/plan-x{0.9,1.0,1.1}.json > "$out/llama_peak/holes.txt" || failed=1
echo "llama_peak $failed" >> "$out/status.txt"

mkdir -p "$out/planner"
for trace in bench/traces/*.csv.gz; do
  name=$(basename "$trace" .csv.gz)
  "$build/tools/plan/strata-plan" "$trace" --no-progress > "$out/planner/$name.txt" || failed=1
done
echo "planner $failed" >> "$out/status.txt"

mkdir -p "$out/viewer"
STRATA_REQUIRE_VIEWER=1 ctest --test-dir "$build" -R 'strata_view|strata_viewer' -V > "$out/viewer/check_viewer.log" 2>&1
status=$?
echo "viewer $status" >> "$out/status.txt"
[ $status -eq 0 ] || failed=1
cp "$build"/artifacts/*.png "$out/viewer/" 2>/dev/null
cat "$out/status.txt"
exit $failed
