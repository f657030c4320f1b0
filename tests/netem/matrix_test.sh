#!/usr/bin/env bash
# The collective matrix (tests/matrix.cpp: every collective and every all-reduce algorithm) on
# emulated multi-host networks: for each world shape HOSTSxRANKS (2x2, 3x2, 2x3), with_network.sh
# makes HOSTS hosts joined by 1 Gbit/s links and `shoal run` starts RANKS ranks on each through
# netns-ssh. Passes only if every job exits 0 and every rank printed its "matrix done over LINK,
# 0 failures" line, where LINK (to the next rank) is shm within a host and tls across hosts:
# which also checks that the ranks landed on the hosts they should.
#
# Needs root (network namespaces; with_network.sh re-runs itself through passwordless sudo).
# usage: matrix_test.sh SHOAL_BIN WORKER_BIN [SHAPE...]   (SHAPE: HOSTSxRANKS; default all three)
set -euo pipefail
shoal="$1" worker="$2"
shift 2
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(2x2 3x2 2x3)
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mktemp /tmp/shoal-netem-matrix-XXXXXX)"
trap 'rm -f "$out"' EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

for shape in "${shapes[@]}"; do
  hosts="${shape%x*}" ranks="${shape#*x}"
  n=$((hosts * ranks))
  echo "== $hosts hosts x $ranks ranks at 1gbit"
  start=$SECONDS
  set +e
  # Bounded twice: the job (timeout 240, and SHOAL_TIMEOUT 60 s for any one wait of a rank),
  # and the whole run with its network setup and teardown.
  # shellcheck disable=SC2016  # expanded by the inner shell, inside the emulated network
  timeout 300 bash "$here/with_network.sh" --hosts "$hosts" --rate 1gbit -- bash -c '
    list=""
    for ip in $NETEM_HOSTS; do list+="${list:+,}$ip:$1"; done
    exec timeout 240 "$2" run --hosts "$list" --ssh "$NETEM_SSH" --timeout 60 -- "$3" matrix
  ' matrix "$ranks" "$shoal" "$worker" >"$out" 2>&1
  rc=$?
  set -e
  cat "$out"
  echo "-- $shape: exit $rc after $((SECONDS - start)) s"
  [ "$rc" = 0 ] || fail "$shape: the job exited $rc"
  for r in $(seq 0 $((n - 1))); do
    next=$(((r + 1) % n))
    link=tls
    [ $((r / ranks)) != $((next / ranks)) ] || link=shm
    want="^\[$r\] rank $r of $n \(local $((r % ranks)) of $ranks, started by shoal run\):"
    want+=" matrix done over $link, 0 failures$"
    grep -Eq "$want" "$out" || fail "$shape: no line matching '$want'"
  done
  if grep -E "FAIL|ERROR|WRONG" "$out" >&2; then fail "$shape: the output reports a failure"; fi
done
echo "PASS"
