#!/usr/bin/env bash
# strata-view's command line: it writes a page for a report and for a snapshot, and refuses bad input with
# exit code 2 and a message naming the file and what is wrong (never a crash, never a page for bad input).
# Usage: check_cli.sh PATH/TO/strata-view
set -uo pipefail
view="$1"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

# expect_fail NAME CONTENT EXPECTED_MESSAGE: strata-view on a file holding CONTENT exits 2, says MESSAGE
# (a fixed string) on stderr, and writes no page.
expect_fail() {
  local name="$1" content="$2" message="$3"
  printf '%s' "$content" >"$work/$name"
  rm -f "$work/out.html"
  "$view" "$work/$name" -o "$work/out.html" 2>"$work/err"
  local rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "$message" "$work/err" && [ ! -e "$work/out.html" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL $name: exit $rc, stderr: $(cat "$work/err"); expected exit 2 and: $message"
  fi
}

expect_ok() {
  local name="$1" input="$2" kind="$3"
  rm -f "$work/out.html"
  if "$view" "$input" -o "$work/out.html" 2>"$work/err" && grep -qF "data-kind=\"$kind\"" "$work/out.html"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL $name: $(cat "$work/err")"
  fi
}

expect_ok report "$here/report_fixture.json" report
printf '{"box":"coalescing_pool","segments":[{"address":4096,"size":1024,"blocks":[{"offset":0,"size":1024,"free":false,"stream":-1}]}]}' >"$work/snap.json"
expect_ok snapshot "$work/snap.json" snapshot

expect_fail truncated.json '{"traces": [{"trace": "t",' "truncated.json: not JSON: line 1, column 27: syntax error while parsing object key - unexpected end of input; expected string literal (the text ends there: truncated?)"
expect_fail empty.json '' "empty.json: not JSON: line 1, column 1: "  # nlohmann's own words for it vary between releases
expect_fail garbage.json 'trace v1
alloc 1 256' "garbage.json: not JSON: line 1, column 3: syntax error while parsing value - invalid literal; last read: 'tra'"
expect_fail unknown.json '{"tool": "something else"}' "unknown.json: the document: is neither a strata-plan report (no \"traces\") nor a strata snapshot (no \"segments\")"
expect_fail badblock.json '{"box":"b","segments":[{"address":0,"size":512,"blocks":[{"offset":0,"size":1024,"free":true,"stream":-1}]}]}' \
  "badblock.json: segments[0].blocks[0]: ends past the end of its segment"
expect_fail badstack.json '{"traces":[{"trace":"t","stacks":[{"name":"x"}]}]}' "badstack.json: traces[0].stacks[0]: has no \"timeline\""
expect_fail negative.json '{"box":"b","segments":[{"address":0,"size":-1,"blocks":[]}]}' "negative.json: segments[0].size: is negative, not a size in bytes"

# Usage errors: exit 2 with the usage text.
for args in "" "$here/report_fixture.json" "-o $work/x.html" "--bogus $here/report_fixture.json -o $work/x.html"; do
  # shellcheck disable=SC2086
  "$view" $args >/dev/null 2>"$work/err"
  rc=$?
  if [ "$rc" -eq 2 ] && grep -qF "usage: strata-view" "$work/err"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL usage '$args': exit $rc"; fi
done
"$view" "$work/missing.json" -o "$work/x.html" 2>"$work/err"
rc=$?
if [ "$rc" -eq 2 ] && grep -qF "missing.json: cannot be read" "$work/err"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL missing file: exit $rc"; fi

echo "strata-view CLI: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
