#!/usr/bin/env bash
# What travels on the wire between hosts: two "hosts" (network namespaces joined by veth pairs on
# a bridge, as netns_test.sh builds them), a 2-rank job across them under `shoal run` that
# all-reduces and sends 1 MiB of floats whose bytes spell a marker, and a packet capture on
# host-a's veth (every byte host-a sends or receives: its rank's link to the other host, and its
# store connection to the launcher). With SHOAL_ENCRYPT=0 the capture must hold the marker and
# the store's keys and values in clear (so the test can fail); with the default (auto) and with
# SHOAL_ENCRYPT=1 it must hold none of them.
#
# Needs root (namespaces, a packet socket); without it, or where namespaces cannot be made, it is
# skipped (exit 77) saying why. Cleans up on every exit path.
# usage: capture_test.sh SHOAL_BIN WORKER_BIN CAPTURE_BIN
set -euo pipefail
shoal="$1" worker="$2" capture="$3"
here="$(cd "$(dirname "$0")" && pwd)"

if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n -E bash "$0" "$@"
  fi
  echo "SKIP: the capture test needs root (or passwordless sudo) for network namespaces and a packet socket" >&2
  exit 77
fi

tag=$$
net="10.232.$((tag % 250)).0"
prefix="${net%.0}"
br="scbr$tag"
ns1="shoal-c1-$tag" ns2="shoal-c2-$tag"
work="$(mktemp -d /tmp/shoal-capture-XXXXXX)"
cap_pid=""

cleanup() {
  [ -n "$cap_pid" ] && kill "$cap_pid" 2>/dev/null || true
  for ns in "$ns1" "$ns2"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "vc1$tag" 2>/dev/null || true
  ip link del "vc2$tag" 2>/dev/null || true
  ip link del "$br" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

if ! ip link add "$br" type bridge 2>"$work/err" || ! ip netns add "$ns1" 2>>"$work/err"; then
  echo "SKIP: cannot create a bridge or a network namespace here: $(tr '\n' ' ' <"$work/err")" >&2
  exit 77
fi
ip netns add "$ns2"
ip addr add "$prefix.1/24" dev "$br"
ip link set "$br" up
i=0
for ns in "$ns1" "$ns2"; do
  i=$((i + 1))
  ip link add "vc$i$tag" type veth peer name "vn$i$tag"
  ip link set "vn$i$tag" netns "$ns"
  ip link set "vc$i$tag" master "$br" up
  ip netns exec "$ns" ip addr add "$prefix.1$i/24" dev "vn$i$tag"
  ip netns exec "$ns" ip link set "vn$i$tag" up
  ip netns exec "$ns" ip link set lo up
done
export SHOAL_NETNS_MAP="$prefix.11=$ns1=host-a $prefix.12=$ns2=host-b"

marker="SHOALMARKERPLAIN"
key="shoal/g0/peer/"   # a key every rank sets in the store
value="$prefix.11:"    # the start of rank 0's address record, a value in the store

fail() {
  echo "FAIL: $*" >&2
  echo "--- job output:" >&2
  cat "$work/out" >&2 || true
  exit 1
}

# Occurrences of a byte string in the capture (grep counts lines; any count > 0 means present).
count() { grep -caF -- "$1" "$work/capture" || true; }

run_job() {  # $1: SHOAL_ENCRYPT value, or "default" for unset; $2: the link kind expected
  local setting="$1" link="$2"
  echo "== SHOAL_ENCRYPT=$setting"
  # The capture has started when it prints "ready": read its output through a FIFO until that
  # line (10 s per line as the upper bound; end-of-file if it died), then drain the rest.
  rm -f "$work/capture.fifo"
  mkfifo "$work/capture.fifo"
  "$capture" "vc1$tag" "$work/capture" >"$work/capture.fifo" 2>&1 &
  cap_pid=$!
  exec 4<"$work/capture.fifo"
  : >"$work/capture.out"
  local line started=0
  while IFS= read -r -t 10 -u 4 line; do
    echo "$line" >>"$work/capture.out"
    if [ "$line" = ready ]; then
      started=1
      break
    fi
  done
  cat <&4 >>"$work/capture.out" &
  drain_pid=$!
  exec 4<&-
  [ "$started" = 1 ] || { cat "$work/capture.out" >&2; fail "the capture did not start"; }
  set +e
  if [ "$setting" = default ]; then
    env -u SHOAL_ENCRYPT timeout 120 "$shoal" run --hosts "$prefix.11:1,$prefix.12:1" \
      --ssh "$here/netns-ssh" --timeout 30 -- "$worker" marker >"$work/out" 2>&1
  else
    SHOAL_ENCRYPT="$setting" timeout 120 "$shoal" run --hosts "$prefix.11:1,$prefix.12:1" \
      --ssh "$here/netns-ssh" --timeout 30 -- "$worker" marker >"$work/out" 2>&1
  fi
  rc=$?
  kill -TERM "$cap_pid"
  wait "$cap_pid"
  cap_rc=$?
  cap_pid=""
  wait "$drain_pid"  # its output, to the end
  set -e
  cat "$work/out"
  cat "$work/capture.out"
  [ "$rc" = 0 ] || fail "the job exited $rc"
  [ "$cap_rc" = 0 ] || fail "the capture exited $cap_rc (frames dropped?)"
  [ "$(grep -c "marker done over $link" "$work/out")" = 2 ] || fail "both ranks should finish over $link"
  local bytes
  bytes="$(sed -n 's/^captured [0-9]* frames, \([0-9]*\) bytes.*/\1/p' "$work/capture.out")"
  # At least the 1 MiB all-reduce and the 1 MiB send crossed host-a's link, in whatever form.
  [ "${bytes:-0}" -ge 2000000 ] || fail "the capture saw only ${bytes:-0} bytes"
}

run_job 0 tcp
[ "$(count "$marker")" -gt 0 ] || fail "no marker in the clear capture: the capture does not see the data"
[ "$(count "$key")" -gt 0 ] || fail "no store key in the clear capture"
[ "$(count "$value")" -gt 0 ] || fail "no store value in the clear capture"
echo "clear: marker in $(count "$marker") frames, store key in $(count "$key"), value in $(count "$value")"

for setting in default 1; do
  run_job "$setting" tls
  for s in "$marker" "$key" "$value"; do
    [ "$(count "$s")" = 0 ] || fail "'$s' travelled in clear with SHOAL_ENCRYPT=$setting"
  done
  echo "encrypted ($setting): no marker, no store key, no store value in the capture"
done
echo "PASS"
