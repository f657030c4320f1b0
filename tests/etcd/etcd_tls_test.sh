#!/usr/bin/env bash
# The etcd store over TLS (etcds://, store/etcd_store.h, common/tls_client.h) against a real
# etcd serving HTTPS with certificates made here by the openssl command: the store contract
# (tests/etcd_store_test.cpp) with SHOAL_ETCD_CACERT, through an IP address and through a host
# name; then with etcd's --client-cert-auth and a client certificate. And the refusals, each a
# one-line error checked by the contract program (EtcdStoreTlsRefusal), whose exit code this
# script checks: no CA given (the system's trust store does not know the throwaway CA), a CA
# that did not sign etcd's certificate, an IP address and a host name the certificate does not
# name, no client certificate (or one from another CA) when etcd demands one, and a TLS variable
# with a plain etcd:// URL. Given `shoal` and a rank program, also a job whose ranks find each
# other through the etcds:// store (the variables reaching shoal::init()), and one refused for
# a TLS variable with etcd://.
#
# Like tests/etcd/etcd_test.sh, etcd runs in a private network namespace, so its fixed ports
# cannot collide with anything; the clients run in the same namespace. Host names resolve
# through the namespace's own /etc/hosts (/etc/netns/<ns>/hosts, which `ip netns exec` mounts).
# Waits are on etcd's "ready to serve" log line, bounded by a timeout.
#
# Needs root (a network namespace), etcd (Debian's etcd-server) and openssl; without root it is
# skipped (exit 77) saying why. Cleans up on every exit path.
# usage: etcd_tls_test.sh ETCD_STORE_TESTS_BIN [SHOAL_BIN TEST_WORKER_BIN]
set -euo pipefail
contract="$(realpath "$1")"
shoal="${2:+$(realpath "$2")}" worker="${3:+$(realpath "$3")}"

if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n -E bash "$0" "$@"
  fi
  echo "SKIP: the etcd TLS test needs root (or passwordless sudo) for a network namespace" >&2
  exit 77
fi
for tool in etcd openssl; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (scripts/setup.sh)" >&2; exit 1; }
done
# The TLS variables come from this script only.
unset SHOAL_ETCD_CACERT SHOAL_ETCD_CERT SHOAL_ETCD_KEY SHOAL_ETCD_USER SHOAL_ETCD_PASSWORD \
  SHOAL_ETCD_PASSWORD_FILE

ns="shoal-etcd-tls-$$"
work="$(mktemp -d /tmp/shoal-etcd-tls-XXXXXX)"
etcd_pid=""

cleanup() {
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "/etc/netns/$ns" "$work"
}
trap cleanup EXIT

if ! ip netns add "$ns" 2>"$work/err"; then
  echo "SKIP: cannot create a network namespace here: $(tr '\n' ' ' <"$work/err")" >&2
  exit 77
fi
ip -n "$ns" link set lo up
mkdir -p "/etc/netns/$ns"
printf '127.0.0.1 localhost etcd.shoal.test wrong.shoal.test\n' >"/etc/netns/$ns/hosts"
in_ns() { ip netns exec "$ns" "$@"; }

# --- Certificates: two CAs, etcd's server certificate from the first, client certificates from
#     each. P-256 keys: quick to make.
cd "$work"
openssl_quiet() {
  if ! openssl "$@" >"$work/openssl.out" 2>&1; then
    echo "FAIL: openssl $*: $(tail -n 5 "$work/openssl.out")" >&2
    exit 1
  fi
}
new_key() { openssl_quiet genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
new_ca() {  # new_ca NAME
  new_key "$1.key"
  openssl_quiet req -new -key "$1.key" -subj "/CN=shoal test $1" -out "$1.csr"
  printf 'basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n' >"$1.ext"
  openssl_quiet x509 -req -in "$1.csr" -signkey "$1.key" -days 2 -extfile "$1.ext" -out "$1.pem"
}
new_cert() {  # new_cert NAME CA EXTENSIONS
  new_key "$1.key"
  openssl_quiet req -new -key "$1.key" -subj "/CN=shoal test $1" -out "$1.csr"
  printf '%s\n' "$3" >"$1.ext"
  openssl_quiet x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 2 \
    -extfile "$1.ext" -out "$1.pem"
}
new_ca ca
new_ca other-ca
# etcd's certificate names 127.0.0.1 and etcd.shoal.test, not 127.0.0.2 or wrong.shoal.test
# (which reach the same etcd). clientAuth too: etcd's JSON gateway dials etcd's gRPC with it.
new_cert server ca "subjectAltName=IP:127.0.0.1,DNS:etcd.shoal.test
extendedKeyUsage=serverAuth,clientAuth
keyUsage=critical,digitalSignature"
new_cert client ca "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature"
new_cert stranger other-ca "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature"
chmod 600 ./*.key

# wait_for FILE PATTERN SECONDS
. "$(dirname "$0")/wait_for.sh"

# start_etcd NAME CLIENT_PORT PEER_PORT [extra etcd flags]: HTTPS for clients on 127.0.0.1 and
# 127.0.0.2.
start_etcd() {
  local name="$1" port="$2" peer="$3"
  shift 3
  # Not through in_ns: $! must be etcd itself (ip netns exec execs it), not a subshell.
  ip netns exec "$ns" etcd --name "$name" --data-dir "$work/data-$name" \
    --listen-client-urls "https://127.0.0.1:$port,https://127.0.0.2:$port" \
    --advertise-client-urls "https://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$name=http://127.0.0.1:$peer" \
    --cert-file "$work/server.pem" --key-file "$work/server.key" "$@" >"$work/$name.log" 2>&1 &
  etcd_pid=$!
  # One line per listener, in any order.
  wait_for "$work/$name.log" "serving client requests on 127.0.0.1:$port" 60
  wait_for "$work/$name.log" "serving client requests on 127.0.0.2:$port" 60
}
stop_etcd() {
  kill "$etcd_pid"
  wait "$etcd_pid" 2>/dev/null || true
}

# expect_refusal DESCRIPTION KIND REGEX URL [VAR=VALUE...]: the store's first request (or its
# construction) fails at once with one line of KIND matching REGEX and naming the address.
expect_refusal() {
  local description="$1" kind="$2" text="$3" url="$4"
  shift 4
  local rc=0
  in_ns env "$@" SHOAL_TEST_ETCD="$url" SHOAL_TEST_ETCD_REFUSAL="$text" \
    SHOAL_TEST_ETCD_REFUSAL_KIND="$kind" timeout 60 "$contract" \
    --gtest_filter=EtcdStoreTlsRefusal.* >"$work/refusal.out" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    echo "FAIL: $description: exit $rc:" >&2
    tail -n 20 "$work/refusal.out" >&2
    exit 1
  fi
  echo "refused, $description: $(grep -m1 '^refused: ' "$work/refusal.out" | cut -c10-)"
}

# 1. TLS, no client certificates.
start_etcd tls 2379 2380
echo "etcd with TLS ready (pid $etcd_pid)"
ca="SHOAL_ETCD_CACERT=$work/ca.pem"
in_ns env "$ca" SHOAL_TEST_ETCD=etcds://127.0.0.1:2379/contract "$contract" \
  --gtest_filter=EtcdStore.*
echo "the contract over etcds:// to an IP address"
in_ns env "$ca" SHOAL_TEST_ETCD=etcds://etcd.shoal.test:2379/contract-dns "$contract" \
  --gtest_filter=EtcdStore.SetGetCheckDelete:EtcdStore.CompareSet
echo "the contract over etcds:// to a host name"

expect_refusal "no CA given (the system's trust store)" StoreError \
  "certificate verify failed: unable to get local issuer certificate" \
  etcds://127.0.0.1:2379/x
expect_refusal "a CA that did not sign etcd's certificate" StoreError \
  "certificate verify failed: unable to get local issuer certificate" \
  etcds://127.0.0.1:2379/x "SHOAL_ETCD_CACERT=$work/other-ca.pem"
expect_refusal "an IP address the certificate does not name" StoreError \
  "certificate verify failed: IP address mismatch" etcds://127.0.0.2:2379/x "$ca"
expect_refusal "a host name the certificate does not name" StoreError \
  "certificate verify failed: hostname mismatch" etcds://wrong.shoal.test:2379/x "$ca"
expect_refusal "a TLS variable with a plain etcd:// URL" InvalidArgument \
  "^SHOAL_ETCD_CACERT set for the plain-HTTP etcd store etcd://127.0.0.1:2379: use etcds://" \
  etcd://127.0.0.1:2379/x "$ca"

if [ -n "$shoal" ]; then
  # A job of 2 ranks (tests/worker.cpp's collective matrix) on the etcds:// store: the launcher
  # passes the URL and the variables on, each rank's init() opens the store with them.
  rc=0
  in_ns env "$ca" timeout 120 "$shoal" run --timeout 30 -n 2 --store etcds://127.0.0.1:2379/job \
    -- "$worker" matrix >"$work/job.out" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { echo "FAIL: the job on etcds:// exited $rc" >&2; tail -n 30 "$work/job.out" >&2; exit 1; }
  echo "a job of 2 ranks on the etcds:// store"
  rc=0
  in_ns env "$ca" timeout 120 "$shoal" run --timeout 30 -n 2 --store etcd://127.0.0.1:2379/job \
    -- "$worker" matrix >"$work/job.out" 2>&1 || rc=$?
  if [ "$rc" = 0 ] || ! grep -q "SHOAL_ETCD_CACERT set for the plain-HTTP etcd store" "$work/job.out"; then
    echo "FAIL: a job on etcd:// with SHOAL_ETCD_CACERT: exit $rc, expected the TLS refusal:" >&2
    tail -n 30 "$work/job.out" >&2
    exit 1
  fi
  echo "refused, a job on etcd:// with SHOAL_ETCD_CACERT: $(grep -m1 "SHOAL_ETCD_CACERT set" "$work/job.out")"
fi
stop_etcd

# 2. etcd demands a client certificate signed by its CA.
start_etcd mtls 2381 2382 --client-cert-auth --trusted-ca-file "$work/ca.pem"
echo "etcd with client certificates ready (pid $etcd_pid)"
in_ns env "$ca" "SHOAL_ETCD_CERT=$work/client.pem" "SHOAL_ETCD_KEY=$work/client.key" \
  SHOAL_TEST_ETCD=etcds://127.0.0.1:2381/contract "$contract" --gtest_filter=EtcdStore.*
echo "the contract over etcds:// with a client certificate"
# The alert etcd sends depends on its Go version: bad certificate (before Go 1.21), certificate
# required (TLS 1.3, Go 1.21 and later).
alert="TLS: .*alert (bad certificate|certificate required)"
expect_refusal "no client certificate" StoreError "$alert" \
  etcds://127.0.0.1:2381/x "$ca"
expect_refusal "a client certificate from another CA" StoreError "TLS: .*alert (bad certificate|unknown ca)" \
  etcds://127.0.0.1:2381/x "$ca" "SHOAL_ETCD_CERT=$work/stranger.pem" \
  "SHOAL_ETCD_KEY=$work/stranger.key"
stop_etcd
echo "PASS"
