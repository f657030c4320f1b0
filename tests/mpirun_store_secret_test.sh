#!/usr/bin/env bash
# mpirun given a store address (SHOAL_STORE_ADDR) and no SHOAL_SECRET: rank 0 hosts the store
# with a secret it generated and sent to the ranks over MPI (run/init.cpp); the collective matrix
# passes on every rank and rank 0 says where the secret came from. The store's port is random and
# retried when taken (rank 0 then fails at once with "cannot host the job's store"), so the test
# never picks a port by binding and closing it.
# usage: mpirun_store_secret_test.sh MPIRUN WORKER
set -euo pipefail
mpirun="$1" worker="$2"
unset SHOAL_SECRET SHOAL_SECRET_FILE MASTER_ADDR MASTER_PORT
out="$(mktemp /tmp/shoal-mpirun-secret-XXXXXX)"
trap 'rm -f "$out"' EXIT
fail() {
  echo "FAIL: $*" >&2
  cat "$out" >&2
  exit 1
}
rc=1
for _ in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 20000))
  set +e
  timeout 240 "$mpirun" --oversubscribe --bind-to none -n 3 -x SHOAL_STORE_ADDR="127.0.0.1:$port" \
    -x SHOAL_LOG_LEVEL=info -x SHOAL_TIMEOUT=120 "$worker" matrix >"$out" 2>&1
  rc=$?
  set -e
  [ "$rc" -ne 0 ] && grep -q "cannot host the job's store" "$out" && continue
  break
done
[ "$rc" -eq 0 ] || fail "mpirun exited $rc"
grep -q "no SHOAL_SECRET; generated one and sent it to the 3 ranks over MPI" "$out" ||
  fail "rank 0 did not say it generated the secret"
for r in 0 1 2; do
  grep -Eq "rank $r of 3 \(local $r of 3, started by mpirun\): matrix done over [a-z]+, 0 failures" \
    "$out" || fail "rank $r did not finish the matrix"
done
echo "PASS"
