#!/usr/bin/env bash
# The etcd store (store/etcd_store.h) against a real etcd: the store contract, an elastic job
# whose rendezvous and membership live in etcd losing a worker, and the etcd member SIGKILLed and
# restarted (same data directory) while a job runs on it.
# The store over TLS (etcds://) is tests/etcd/etcd_tls_test.sh: it needs no libtorch, so it runs
# with the engine's tests.
#
# etcd runs in a private network namespace, so its fixed ports (2379, 2380) cannot collide with
# anything; the jobs run in the same namespace. Waits are on events: etcd's "ready to serve" log
# line and the job's "STEP n" progress lines (tail -F), each bounded by a timeout.
#
# Needs root (a network namespace) and etcd (Debian's etcd-server); without root it is skipped
# (exit 77) saying why. Cleans up on every exit path.
# usage: etcd_test.sh SHOAL_BIN ELASTIC_WORKER_BIN ETCD_STORE_TESTS_BIN
set -euo pipefail
shoal="$1" worker="$2" contract="$3"

if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n -E bash "$0" "$@"
  fi
  echo "SKIP: the etcd test needs root (or passwordless sudo) for a network namespace" >&2
  exit 77
fi
command -v etcd >/dev/null || { echo "FAIL: etcd is not installed (scripts/setup.sh installs etcd-server)" >&2; exit 1; }

ns="shoal-etcd-$$"
work="$(mktemp -d /tmp/shoal-etcd-XXXXXX)"
etcd_pid="" job_pid=""

cleanup() {
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

if ! ip netns add "$ns" 2>"$work/err"; then
  echo "SKIP: cannot create a network namespace here: $(tr '\n' ' ' <"$work/err")" >&2
  exit 77
fi
ip -n "$ns" link set lo up
in_ns() { ip netns exec "$ns" "$@"; }

# wait_for FILE PATTERN SECONDS
. "$(dirname "$0")/wait_for.sh"

start_etcd() {
  local log="$1"
  # Not through in_ns: $! must be etcd itself (ip netns exec execs it), not a subshell.
  ip netns exec "$ns" etcd --name t --data-dir "$work/data" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster t=http://127.0.0.1:2380 >"$log" 2>&1 &
  etcd_pid=$!
  wait_for "$log" "ready to serve client requests" 60
}

start_etcd "$work/etcd1.log"
echo "etcd ready (pid $etcd_pid)"

# 1. The store contract (its authentication case comes in 4; its TLS refusals are
#    tests/etcd/etcd_tls_test.sh's).
in_ns env SHOAL_TEST_ETCD=etcd://127.0.0.1:2379/contract "$contract" \
  --gtest_filter=-EtcdStoreAuth.*:EtcdStoreTlsRefusal.*

# 2. An elastic job through etcd loses member 1 in step 10: 3 workers finish, equal.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
check_done() {
  local out="$1" steps="$2"
  local lines digests
  lines=$(grep -c "DONE member .* world 3 step $steps " "$out" || true)
  digests=$(grep -o "digest [0-9a-f]*" "$out" | sort -u | wc -l)
  if [ "$lines" != 3 ] || [ "$digests" != 1 ]; then
    echo "FAIL: expected 3 equal workers at step $steps, got $lines lines and $digests digests:" >&2
    tail -n 30 "$out" >&2
    exit 1
  fi
}
rc=0
in_ns env SHOAL_STORE_ADDR=etcd://127.0.0.1:2379/job1 timeout 300 "$shoal" run --timeout 30 \
  --elastic 2:4 -n 4 -- "$worker" --steps 40 --die 1:10:before >"$work/job1.out" 2>&1 || rc=$?
[ "$rc" = 0 ] || { echo "FAIL: job 1 exited $rc" >&2; tail -n 30 "$work/job1.out" >&2; exit 1; }
check_done "$work/job1.out" 40
echo "job 1: a worker lost, 3 went on, the store in etcd"

# 3. etcd is SIGKILLed and restarted while a job runs on it; a worker dies after the restart,
#    so the view change goes through the restarted etcd.
in_ns env SHOAL_STORE_ADDR=etcd://127.0.0.1:2379/job2 timeout 300 "$shoal" run --timeout 30 \
  --elastic 2:4 -n 4 -- "$worker" --steps 3000 --progress-every 100 --die 1:2500:before \
  >"$work/job2.out" 2>&1 &
job_pid=$!
wait_for "$work/job2.out" "STEP 200" 120
kill -9 "$etcd_pid"
wait "$etcd_pid" 2>/dev/null || true
kill -0 "$job_pid" || { echo "FAIL: job 2 ended before etcd was killed" >&2; tail "$work/job2.out" >&2; exit 1; }
start_etcd "$work/etcd2.log"
echo "etcd restarted (pid $etcd_pid)"
rc=0
wait "$job_pid" || rc=$?
[ "$rc" = 0 ] || { echo "FAIL: job 2 exited $rc" >&2; tail -n 30 "$work/job2.out" >&2; exit 1; }
check_done "$work/job2.out" 3000
echo "job 2: survived the etcd restart and a worker's death after it"

# 4. etcd's authentication on (a root user with a password, through the JSON gateway): the
#    contract with the user's credentials, refusals without them, and a job whose ranks get them
#    from the launcher's environment.
gateway() {  # POSTs JSON to etcd's gateway (python3: no HTTP client among the packages)
  local path="$1" body="$2"
  if ! in_ns python3 -c 'import sys, urllib.request
urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:2379" + sys.argv[1],
    data=sys.argv[2].encode(), method="POST"), timeout=30).read()' "$path" "$body" \
      >"$work/gateway.out" 2>&1; then
    echo "FAIL: etcd $path: $(tail -n 3 "$work/gateway.out")" >&2
    exit 1
  fi
}
gateway /v3/auth/user/add '{"name":"root","password":"pw-4-shoal"}'
gateway /v3/auth/role/add '{"name":"root"}'
gateway /v3/auth/user/grant '{"user":"root","role":"root"}'
gateway /v3/auth/enable '{}'
printf 'pw-4-shoal\n' >"$work/password"
chmod 600 "$work/password"
export SHOAL_ETCD_USER=root SHOAL_ETCD_PASSWORD_FILE="$work/password"
in_ns env SHOAL_TEST_ETCD=etcd://127.0.0.1:2379/contract-auth "$contract" \
  --gtest_filter=-EtcdStoreTlsRefusal.*
rc=0
in_ns env SHOAL_STORE_ADDR=etcd://127.0.0.1:2379/job3 timeout 300 "$shoal" run --timeout 30 \
  --elastic 2:4 -n 3 -- "$worker" --steps 10 >"$work/job3.out" 2>&1 || rc=$?
[ "$rc" = 0 ] || { echo "FAIL: job 3 exited $rc" >&2; tail -n 30 "$work/job3.out" >&2; exit 1; }
check_done "$work/job3.out" 10
echo "job 3: the store in etcd with authentication on"
echo "PASS"
