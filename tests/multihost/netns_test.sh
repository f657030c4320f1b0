#!/usr/bin/env bash
# Multi-host test on one machine: two "hosts", each a network namespace (own network stack, own
# hostname) joined to this one by veth pairs on a bridge. `shoal run` starts 2 ranks on each
# through netns-ssh (ssh's stand-in) and the job all-reduces across them over TCP, in TLS (the
# default, SHOAL_ENCRYPT=auto, encrypts what crosses hosts; capture_test.sh checks the bytes);
# shared memory is used only between the two ranks of the same host. Then a rank on one host is
# killed mid-collective: the launcher must stop the job, fail, and leave no process behind.
#
# Needs root (network namespaces). Cleans up on every exit path.
# usage: netns_test.sh SHOAL_BIN DEMO_BIN WORKER_BIN
set -euo pipefail
shoal="$1" demo="$2" worker="$3"
here="$(cd "$(dirname "$0")" && pwd)"

if [ "$(id -u)" != 0 ]; then
  # A CI user with passwordless sudo (as scripts/setup.sh uses for apt) runs it through sudo.
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n -E bash "$0" "$@"
  fi
  echo "FAIL: the multi-host test needs root (or passwordless sudo) to create network namespaces" >&2
  exit 1
fi

tag=$$
net="10.231.$((tag % 250)).0"
prefix="${net%.0}"
br="shbr$tag"
ns1="shoal-h1-$tag" ns2="shoal-h2-$tag"
work="$(mktemp -d /tmp/shoal-netns-XXXXXX)"

cleanup() {
  for ns in "$ns1" "$ns2"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "vh1$tag" 2>/dev/null || true
  ip link del "vh2$tag" 2>/dev/null || true
  ip link del "$br" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

ip link add "$br" type bridge
ip addr add "$prefix.1/24" dev "$br"
ip link set "$br" up
i=0
for ns in "$ns1" "$ns2"; do
  i=$((i + 1))
  ip netns add "$ns"
  ip link add "vh$i$tag" type veth peer name "vn$i$tag"
  ip link set "vn$i$tag" netns "$ns"
  ip link set "vh$i$tag" master "$br" up
  ip netns exec "$ns" ip addr add "$prefix.1$i/24" dev "vn$i$tag"
  ip netns exec "$ns" ip link set "vn$i$tag" up
  ip netns exec "$ns" ip link set lo up
done
export SHOAL_NETNS_MAP="$prefix.11=$ns1=host-a $prefix.12=$ns2=host-b"
ssh_cmd="$here/netns-ssh"

fail() {
  echo "FAIL: $*" >&2
  echo "--- output:" >&2
  cat "$work/out" >&2 || true
  exit 1
}

echo "== a job across two hosts"
set +e
timeout 120 "$shoal" run --hosts "$prefix.11:2,$prefix.12:2" --ssh "$ssh_cmd" --timeout 30 \
  --output-dir "$work/logs" -- "$demo" --count 300001 --iterations 2 >"$work/out" 2>&1
rc=$?
set -e
cat "$work/out"
[ "$rc" = 0 ] || fail "the job exited $rc"
grep -q "^\[0\] rank 0 of 4 on host-a (local 0 of 2), started by shoal run; links 1:shm 2:tls 3:tls$" "$work/out" ||
  fail "rank 0 should be on host-a, reach rank 1 over shm and ranks 2, 3 over tls"
grep -q "^\[3\] rank 3 of 4 on host-b (local 1 of 2), started by shoal run; links 0:tls 1:tls 2:shm$" "$work/out" ||
  fail "rank 3 should be on host-b, reach rank 2 over shm and ranks 0, 1 over tls"
[ "$(grep -c 'result verified on every rank' "$work/out")" = 3 ] || fail "three verified all-reduces expected"
[ -s "$work/logs/rank3.log" ] || fail "--output-dir should hold rank3.log"
if grep -q "$(printf '%s' "SHOAL_SECRET=")" "$work/out"; then fail "the secret was printed"; fi

echo "== a rank on host-b killed in the middle of an all-reduce"
set +e
timeout 120 "$shoal" run --hosts "$prefix.11:2,$prefix.12:2" --ssh "$ssh_cmd" --timeout 20 \
  --grace 3 -- "$worker" loop allreduce_ring >"$work/out" 2>&1 &
job=$!
set -e
victim=""
for _ in $(seq 1 300); do
  for pid in $(ip netns pids "$ns2"); do
    if tr "\\0" "\\n" 2>/dev/null <"/proc/$pid/environ" | grep -qx "SHOAL_RANK=3" &&
      grep -q shoal_test_worker "/proc/$pid/cmdline" 2>/dev/null; then
      victim=$pid
    fi
  done
  [ -n "$victim" ] && grep -q "^\[3\] ready" "$work/out" && break
  sleep 0.1
done
[ -n "$victim" ] || fail "rank 3 never started on host-b"
# While the job runs: the launcher's store listens on the address its ranks were given (the
# bridge's, which routes to the hosts), not on every interface.
store="$(sed -n 's/^shoal run: .*store at \([0-9.]*:[0-9]*\).*/\1/p' "$work/out" | head -1)"
[ -n "$store" ] || fail "the launcher did not say where its store is"
listeners="$(ss -Hltn "sport = :${store##*:}" | awk '{print $4}')"
[ "$listeners" = "$store" ] ||
  fail "the store should listen on $store only; listening: $(echo $listeners)"
[ "${store%:*}" = "$prefix.1" ] || fail "the store should be at the bridge's address $prefix.1, not $store"
kill -9 "$victim" || fail "rank 3 (pid $victim) was gone before it could be killed"
set +e
wait "$job"
rc=$?
set -e
cat "$work/out"
[ "$rc" != 0 ] || fail "the job should fail when a rank is killed"
[ "$rc" != 124 ] || fail "the job hung until timeout(1) ended it"
grep -q "job failed: rank 3 (host $prefix.12" "$work/out" || fail "the summary should name rank 3 first"
# (Survivors may be stopped by the launcher before they print their own PeerError: the engine's
# fault-injection tests check those messages.)
# The launcher has exited; its ranks' processes must be gone too. Checked until they are (the
# kernel reaps asynchronously), with 10 s as the upper bound, not slept on for a fixed time.
for ns in "$ns1" "$ns2"; do
  for _ in $(seq 1 100); do
    [ -z "$(ip netns pids "$ns")" ] && break
    sleep 0.1
  done
  left="$(ip netns pids "$ns" | wc -l)"
  [ "$left" = 0 ] || fail "$left processes left behind in $ns: $(ip netns pids "$ns" | xargs -r ps -o pid,cmd -p)"
done
echo "PASS"
