#!/usr/bin/env bash
# The emulated network's delay and loss (with_network.sh --delay / --loss), whichever way this
# kernel gives them (sch_netem, or the netfilter queue of tests/netem/netem_queue.cpp):
#  1. 100 Mbit/s with 5 ms one way: a TCP round trip between two hosts takes 10-60 ms, and 4 MiB
#     arrive intact;
#  2. 5% loss: 8 MiB arrive intact (TCP resends), and where the queue emulates it, it dropped
#     2-10% of the packets it saw.
# Needs root (network namespaces). usage: delay_loss_test.sh QUEUE_PROGRAM
set -euo pipefail
queue="$1"
here="$(cd "$(dirname "$0")" && pwd)"
log="$(mktemp /tmp/shoal-netem-delay-XXXXXX)"
trap 'rm -f "$log"' EXIT
fail() {
  echo "FAIL: $*" >&2
  cat "$log" >&2
  exit 1
}

echo "== 100mbit, 5ms one way"
timeout 300 bash "$here/with_network.sh" --hosts 2 --rate 100mbit --delay 5ms \
  --queue-program "$queue" -- python3 "$here/link_check.py" --rtt-min-ms 10 --rtt-max-ms 60 \
  >"$log" 2>&1 || fail "the delayed link's check failed (exit $?)"
cat "$log"
grep -q "intact" "$log" || fail "no transfer reported"
if grep -q "delay/loss by queue" "$log"; then
  grep -Eq "netem_queue: [1-9][0-9]* packets, 0 dropped" "$log" ||
    fail "the queue's counts are missing or it dropped packets without --loss"
fi

echo "== 5% loss"
timeout 300 bash "$here/with_network.sh" --hosts 2 --rate none --loss 5% \
  --queue-program "$queue" -- python3 "$here/link_check.py" --rounds 200 --bytes $((8 << 20)) \
  >"$log" 2>&1 || fail "the lossy link's check failed (exit $?)"
cat "$log"
if grep -q "delay/loss by queue" "$log"; then
  # Both hosts' counts: the fraction dropped over all packets they saw.
  read -r packets dropped < <(sed -nE 's/.*netem_queue: ([0-9]+) packets, ([0-9]+) dropped.*/\1 \2/p' \
    "$log" | awk '{ p += $1; d += $2 } END { print p + 0, d + 0 }')
  [ "$packets" -ge 300 ] || fail "only $packets packets went through the queues"
  awk -v p="$packets" -v d="$dropped" 'BEGIN { exit !(d >= 0.02 * p && d <= 0.10 * p) }' ||
    fail "the queues dropped $dropped of $packets packets, not 2-10%"
  echo "dropped $dropped of $packets packets"
fi
echo "PASS"
