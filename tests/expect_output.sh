#!/usr/bin/env bash
# Runs a command and passes only if it exits 0 AND its output says what it should. (ctest's
# PASS_REGULAR_EXPRESSION alone ignores the exit code: a job whose rank 3 crashed after rank 0
# printed its line would pass.)
#
# usage: expect_output.sh [--expect ERE]... [--reject ERE]... -- command [args...]
#   --expect ERE  some line of the output must match (grep -E), for each --expect given
#   --reject ERE  no line may match
# The command's output is shown as it runs (ctest keeps it in the test log).
set -uo pipefail
expects=() rejects=()
while [ $# -gt 0 ]; do
  case "$1" in
    --expect) expects+=("$2"); shift 2 ;;
    --reject) rejects+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "expect_output.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "expect_output.sh: no command given" >&2; exit 2; }
out="$(mktemp /tmp/shoal-expect-XXXXXX)"
trap 'rm -f "$out"' EXIT
"$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
status=0
if [ "$rc" != 0 ]; then
  echo "expect_output.sh: FAIL: '$1' exited $rc" >&2
  status=1
fi
for e in "${expects[@]}"; do
  if ! grep -Eq -- "$e" "$out"; then
    echo "expect_output.sh: FAIL: no line of the output matches '$e'" >&2
    status=1
  fi
done
for r in "${rejects[@]}"; do
  if grep -Eq -- "$r" "$out"; then
    echo "expect_output.sh: FAIL: the output has a line matching '$r':" >&2
    grep -E -- "$r" "$out" | head -5 >&2
    status=1
  fi
done
[ "$status" = 0 ] && echo "expect_output.sh: PASS (exit 0, output as expected)"
exit "$status"
