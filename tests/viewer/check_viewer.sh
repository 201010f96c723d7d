#!/usr/bin/env bash
# The viewer's pages in headless Chromium: a strata-plan report (the committed fixture: 2 traces
# x 3 stacks, 4,000-point timelines the page must downsample itself, a map of more than 1,000 blocks), a real
# snapshot written by strata's own pool, and the speed check (400,000 timeline points per stack, a
# 20,000-block map, ready in under 5 s). Each page must report data-rendered=ok, no script error and the
# series and block counts computed from its JSON (check_dom.py). Screenshots go to ARTIFACTS/. Given
# strata-plan, also its own --html report of the README's demo (the path users take), checked against its --json.
# Exit 77 (skipped) when no Chromium is installed, unless STRATA_REQUIRE_VIEWER=1.
# Usage: check_viewer.sh PATH/TO/strata-view PATH/TO/strata_viewer_snapshot_fixture ARTIFACTS_DIR [PATH/TO/strata-plan]
set -euo pipefail
view="$1" make_snapshot="$2" artifacts="$3" plan="${4:-}"
here="$(cd "$(dirname "$0")" && pwd)"

browser=""
for name in chromium chromium-browser google-chrome-stable google-chrome; do
  if command -v "$name" >/dev/null 2>&1; then browser="$(command -v "$name")"; break; fi
done
if [ -z "$browser" ] || ! command -v python3 >/dev/null 2>&1; then
  missing="chromium (Debian's chromium package; .ci/deps viewer installs it)"
  [ -n "$browser" ] && missing="python3"
  if [ "${STRATA_REQUIRE_VIEWER:-0}" = 1 ]; then
    echo "FAIL: STRATA_REQUIRE_VIEWER=1 but $missing is not installed"
    exit 1
  fi
  echo "SKIP: the viewer's browser check needs $missing"
  exit 77
fi
echo "browser: $browser ($("$browser" --version 2>/dev/null || echo 'version unknown'))"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"
# As root Chromium refuses to start without --no-sandbox; a profile of its own lets tests run side by side.
flags=(--headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --user-data-dir="$work/profile")
failed=0

# check NAME JSON [check_dom.py options]: render (unless NAME.html exists), load in Chromium (with the
# page's self-test: every map shown once, hovers), compare the DOM with the JSON.
check() {
  local name="$1" json="$2"
  shift 2
  [ -e "$work/$name.html" ] || "$view" "$json" -o "$work/$name.html"
  if ! timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$work/$name.html#selftest" >"$work/$name.dom" 2>"$work/$name.log"; then
    echo "FAIL $name: Chromium did not load the page"; tail -5 "$work/$name.log"; failed=$((failed + 1)); return
  fi
  echo "== $name"
  python3 "$here/check_dom.py" "$json" "$work/$name.dom" --selftest "$@" || failed=$((failed + 1))
}

screenshot() {
  local name="$1" out="$2" size="${3:-1400,1000}"
  timeout 120 "$browser" "${flags[@]}" --window-size="$size" --screenshot="$out" "file://$work/$name.html" \
    >/dev/null 2>"$work/$name.shot.log" || { echo "FAIL $name: no screenshot"; failed=$((failed + 1)); return; }
  [ -s "$out" ] || { echo "FAIL $name: empty screenshot"; failed=$((failed + 1)); return; }
  echo "screenshot: $out"
}

check report "$here/report_fixture.json"
screenshot report "$artifacts/viewer.png"

# The check can fail: the same page with a script error thrown while drawing must be reported as broken.
sed "s|^  var started = performance.now();\$|&\n  undefined.sabotage;|" "$work/report.html" >"$work/broken.html"
if ! grep -q '^  undefined.sabotage;$' "$work/broken.html"; then
  echo "FAIL: could not plant a script error in the page (check_viewer.sh is out of date with viewer.js)"; failed=$((failed + 1))
else
  timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$work/broken.html" >"$work/broken.dom" 2>/dev/null || true
  if python3 "$here/check_dom.py" "$here/report_fixture.json" "$work/broken.dom" >"$work/broken.out" &&
     ! grep -q "FAIL rendered: data-rendered='error'" "$work/broken.out"; then
    echo "FAIL: a page with a script error passed the check"; cat "$work/broken.out"; failed=$((failed + 1))
  elif grep -q "FAIL rendered: data-rendered='error'" "$work/broken.out" && grep -q "FAIL no script errors: data-errors='1'" "$work/broken.out"; then
    echo "ok   a page with a script error is reported as one"
  else
    echo "FAIL: a page with a script error was not reported as data-rendered=error, data-errors=1"; cat "$work/broken.out"; failed=$((failed + 1))
  fi
fi

"$make_snapshot" >"$work/snapshot.json"
check snapshot "$work/snapshot.json"
screenshot snapshot "$artifacts/viewer_snapshot.png"

python3 "$here/make_report.py" --big >"$work/big.json"
check big "$work/big.json" --max-ready-ms 5000

pages=3
if [ -n "$plan" ]; then
  # The README's demo, from the repository's root, so that the report names the trace as a user would.
  (cd "$here/../.." && "$plan" bench/traces/bert_train_varlen.csv.gz --capacity 15GiB --no-progress \
     --json "$work/plan.json" --html "$work/plan.html") >"$work/plan.log" 2>&1 ||
    { echo "FAIL strata-plan --html:"; cat "$work/plan.log"; failed=$((failed + 1)); }
  check plan "$work/plan.json"
  screenshot plan "$artifacts/viewer_plan.png" 1400,2300  # tall: 13 stacks, their charts and the map
  pages=4
fi

if [ "$failed" -ne 0 ]; then
  echo "viewer: $failed page(s) FAILED"
  exit 1
fi
echo "viewer: $pages pages rendered and checked in Chromium"
