#!/usr/bin/env bash
# Runs a command on an emulated network of H hosts, on this one machine. Each host is a network
# namespace joined to this (root) namespace by a veth pair on a bridge, as in
# tests/multihost/netns_test.sh; commands reach a host through tests/multihost/netns-ssh (ssh's
# stand-in: the host's namespace and its own hostname, host-1 .. host-H). Every host's link is
# shaped in both directions: a token bucket (tc tbf) at --rate on the namespace side's egress
# (what the host sends) and on the bridge side's egress (what it receives), so a host can neither
# send nor receive faster than its link. --delay and --loss give a one-way delay D between any
# two hosts (RTT 2D) and lose each packet between hosts with the given probability once: with tc
# netem on the namespace side where the kernel has sch_netem, else with a netfilter queue in
# each host (tests/netem/netem_queue.cpp: an iptables NFQUEUE rule on what the host receives over
# its link hands each packet to a program that holds it for D, or drops it); the queue's counts
# are printed at the end. Where neither can be had (no sch_netem, and no iptables or no queue
# program), the run fails (exit 2) unless --delay-optional is given, and then goes on with the
# rate alone, saying so.
#
# usage: with_network.sh --hosts H [--rate 100mbit|1gbit|RATE|none] [--delay 5ms] [--loss 0.1%]
#                        [--delay-optional] [--queue-program PATH] -- COMMAND [ARGS...]
#   RATE is tc's notation, a whole number of kbit, mbit or gbit (default 1gbit).
#   PATH is the built shoal_netem_queue (default: $NETEM_QUEUE_PROGRAM, else
#   build/tests/shoal_netem_queue of this checkout).
#
# COMMAND runs in the root namespace (where the bridge has the address PREFIX.1) with:
#   NETEM_HOSTS       the hosts' addresses in host order, space-separated (PREFIX.11, .12, ...)
#   NETEM_NAMESPACES  their namespaces, in the same order
#   NETEM_SSH         the absolute path of tests/multihost/netns-ssh
#   SHOAL_NETNS_MAP   "ip=namespace=hostname ..." as netns-ssh reads it
#   NETEM_RATE        the rate applied ("none" when unshaped)
#   NETEM_DELAY       the one-way delay applied, empty when none
#   NETEM_LOSS        the loss applied, empty when none
# e.g. a job of 2 hosts x 2 ranks at 100 Mbit/s:
#   tests/netem/with_network.sh --hosts 2 --rate 100mbit -- bash -c \
#     'build/shoal run --hosts ${NETEM_HOSTS// /:2,}:2 --ssh "$NETEM_SSH" -- build/shoal_demo'
#
# Exits with COMMAND's exit status (2 for a usage or setup error). Everything it made (processes
# left in the namespaces, the namespaces, links and bridge) is removed on every exit path,
# signals included. Names and the subnet are unique per invocation, so runs can overlap.
# Needs root (or passwordless sudo, through which it re-runs itself).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
me="with_network.sh"

usage() {
  sed -n 's/^# \{0,1\}//; /^usage:/,/^$/p' "$0" | sed '/^$/q' >&2
  exit 2
}
die() {
  echo "$me: $*" >&2
  exit 2
}

hosts="" rate="1gbit" delay="" loss="" delay_optional=0
queue_program="${NETEM_QUEUE_PROGRAM:-$here/../../build/tests/shoal_netem_queue}"
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) [ $# -ge 2 ] || usage; hosts="$2"; shift 2 ;;
    --rate) [ $# -ge 2 ] || usage; rate="$2"; shift 2 ;;
    --delay) [ $# -ge 2 ] || usage; delay="$2"; shift 2 ;;
    --loss) [ $# -ge 2 ] || usage; loss="$2"; shift 2 ;;
    --delay-optional) delay_optional=1; shift ;;
    --queue-program) [ $# -ge 2 ] || usage; queue_program="$2"; shift 2 ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) echo "$me: unknown option '$1'" >&2; usage ;;
  esac
done
[ $# -gt 0 ] || { echo "$me: no command given (after --)" >&2; usage; }
if ! [[ "$hosts" =~ ^[1-9][0-9]*$ ]] || [ "$hosts" -gt 64 ]; then
  die "--hosts: a number from 1 to 64"
fi
[ "$rate" = none ] || [[ "$rate" =~ ^[1-9][0-9]*(k|m|g)bit$ ]] ||
  die "--rate: none, or a whole number of kbit, mbit or gbit (e.g. 100mbit, 1gbit), not '$rate'"
[ -z "$delay" ] || [[ "$delay" =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] ||
  die "--delay: a time such as 5ms, not '$delay'"
[ -z "$loss" ] || [[ "$loss" =~ ^[0-9]+(\.[0-9]+)?%$ ]] ||
  die "--loss: a percentage such as 0.1%, not '$loss'"

# The queue program's units: whole microseconds and parts per million.
delay_us=0 loss_ppm=0
[ -z "$delay" ] || delay_us="$(awk -v d="$delay" 'BEGIN {
  n = d + 0; u = d; sub(/^[0-9.]+/, "", u)
  printf "%d", n * (u == "s" ? 1000000 : u == "ms" ? 1000 : 1) + 0.5 }')"
[ -z "$loss" ] || loss_ppm="$(awk -v l="${loss%\%}" 'BEGIN { printf "%d", l * 10000 + 0.5 }')"
[ "$loss_ppm" -le 1000000 ] || die "--loss: at most 100%, not '$loss'"

if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    again=(--hosts "$hosts" --rate "$rate")
    [ -z "$delay" ] || again+=(--delay "$delay")
    [ -z "$loss" ] || again+=(--loss "$loss")
    [ "$delay_optional" = 0 ] || again+=(--delay-optional)
    again+=(--queue-program "$queue_program")
    exec sudo -n -E bash "$0" "${again[@]}" -- "$@"
  fi
  die "needs root (or passwordless sudo) to create network namespaces"
fi
for tool in ip tc unshare flock; do
  command -v "$tool" >/dev/null || die "needs '$tool' (iproute2, util-linux)"
done

# The token bucket for a rate: burst = rate / 250 (the bytes of 4 ms at the rate), at least
# 64 KiB so that one GSO packet (up to 64 KiB on a veth) always fits; limit (the bytes queued
# before tail drop) = 50 ms at the rate, at least 4 bursts, so TCP keeps the link full.
rate_bits=0
if [ "$rate" != none ]; then
  n="${rate%?bit}"
  case "$rate" in
    *kbit) rate_bits=$((n * 1000)) ;;
    *mbit) rate_bits=$((n * 1000000)) ;;
    *gbit) rate_bits=$((n * 1000000000)) ;;
  esac
  burst=$((rate_bits / 8 / 250))
  [ "$burst" -ge 65536 ] || burst=65536
  limit=$((rate_bits / 8 / 20))
  [ "$limit" -ge $((4 * burst)) ] || limit=$((4 * burst))
fi

tag=$$
ns=() vh=() vn=() ips=()
queues=() queue_logs=()   # the queue programs' pids and stderr files (queue mode)
emulation=""               # how delay/loss are emulated: netem or queue (empty: not asked for)
lock="/run/lock/shoal-netem.lock"
child=""

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  set +e
  if [ -n "$child" ]; then
    # COMMAND is still running (a signal ended this script): stopped like `timeout` would,
    # SIGTERM, then SIGKILL after 10 s.
    kill -TERM "$child" 2>/dev/null
    for _ in $(seq 1 100); do
      kill -0 "$child" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$child" 2>/dev/null
  fi
  # The queue programs first, asked to stop (they release what they hold and print their
  # counts) and waited for; a watchdog kills any still there after 5 s (a deadline, not a wait).
  local q log watchdog
  for q in "${queues[@]}"; do
    kill -TERM "$q" 2>/dev/null
    (sleep 5 && kill -9 "$q") </dev/null >/dev/null 2>&1 &
    watchdog=$!
    wait "$q" 2>/dev/null
    kill "$watchdog" 2>/dev/null
  done
  for log in "${queue_logs[@]}"; do
    [ ! -s "$log" ] || sed "s/^/$me: /" "$log" >&2
    rm -f "$log"
  done
  # Processes left in the namespaces (ranks whose launcher did not stop them), then the
  # namespaces (which takes their ends of the veth pairs), the bridge-side ends, the bridge.
  local n pid left
  for n in "${ns[@]}"; do
    for pid in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  done
  for n in "${ns[@]}"; do
    # The kernel reaps asynchronously: checked until they are gone, for at most 5 s.
    for _ in $(seq 1 50); do
      left="$(ip netns pids "$n" 2>/dev/null)"
      [ -z "$left" ] && break
      sleep 0.1
    done
    [ -z "$left" ] || echo "$me: processes still in $n after kill -9: $left" >&2
    ip netns del "$n" 2>/dev/null
  done
  for n in "${vh[@]}"; do ip link del "$n" 2>/dev/null; done
  ip link del "$br" 2>/dev/null
  exit "$rc"
}
br="nebr$tag"
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# A /24 of 10.232.0.0/16 no interface here uses yet, chosen and claimed (the bridge's address)
# under a lock, so that runs started together do not pick the same one. (netns_test.sh uses
# 10.231.x.)
exec 9>"$lock"
flock -w 30 9 || die "could not take $lock within 30 s"
prefix=""
for i in $(seq 0 249); do
  x=$(((tag + i) % 250 + 1))
  if ! ip -o -4 addr show | grep -q " 10\.232\.$x\."; then
    prefix="10.232.$x"
    break
  fi
done
[ -n "$prefix" ] || die "no free /24 left in 10.232.0.0/16"
ip link add "$br" type bridge
ip addr add "$prefix.1/24" dev "$br"
ip link set "$br" up
exec 9>&-

# shape DEV WITH_NETEM [PREFIX...]: shapes DEV's egress, running tc through PREFIX (nothing,
# or "ip netns exec NS"); netem (if WITH_NETEM and asked for) as the root with tbf below it.
shape() {
  local dev="$1" with_netem="$2"
  shift 2
  local netem_args=()
  [ -z "$delay" ] || netem_args+=(delay "$delay")
  [ -z "$loss" ] || netem_args+=(loss "$loss")
  if [ "$with_netem" = 1 ] && [ "$emulation" = netem ] && [ ${#netem_args[@]} -gt 0 ]; then
    # netem holds packets for the delay: its queue must take delay x rate of them.
    "$@" tc qdisc add dev "$dev" root handle 1: netem "${netem_args[@]}" limit 100000
    [ "$rate" = none ] ||
      "$@" tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" \
        limit "$limit"
  elif [ "$rate" != none ]; then
    "$@" tc qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst "$burst" limit "$limit"
  fi
}

map=""
for i in $(seq 1 "$hosts"); do
  ns+=("netem-h$i-$tag")
  vh+=("neh$i-$tag")
  vn+=("nen$i-$tag")
  ips+=("$prefix.$((10 + i))")
  n="${ns[-1]}" h="${vh[-1]}" v="${vn[-1]}" ip="${ips[-1]}"
  ip netns add "$n"
  ip link add "$h" type veth peer name "$v"
  ip link set "$v" netns "$n"
  ip link set "$h" master "$br" up
  ip netns exec "$n" ip addr add "$ip/24" dev "$v"
  ip netns exec "$n" ip link set "$v" up
  ip netns exec "$n" ip link set lo up
  if [ "$i" = 1 ] && [ -n "$delay$loss" ]; then
    # sch_netem where this kernel has it (tried on the new namespace's loopback), else the
    # netfilter queue, else neither.
    if ip netns exec "$n" tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
      ip netns exec "$n" tc qdisc del dev lo root
      emulation=netem
    elif [ -x "$queue_program" ] && command -v iptables >/dev/null; then
      emulation=queue
    else
      why="no sch_netem"
      command -v iptables >/dev/null || why+=", no iptables"
      [ -x "$queue_program" ] || why+=", no queue program at $queue_program"
      if [ "$delay_optional" = 1 ]; then
        echo "$me: delay/loss cannot be emulated here ($why); going on with the rate only" \
          "(--delay-optional)" >&2
        delay="" loss=""
      else
        echo "$me: delay/loss cannot be emulated here ($why); give --delay-optional to run" \
          "with the rate only" >&2
        exit 2
      fi
    fi
  fi
  if [ "$emulation" = queue ]; then
    # The program first, bound and ready, then the rule that sends it what the host receives
    # over its link (a packet queued with nobody bound would be dropped).
    queue_logs+=("$(mktemp /tmp/shoal-netem-queue-XXXXXX)")
    exec {qfd}< <(exec ip netns exec "$n" "$queue_program" --queue 0 --delay-us "$delay_us" \
      --loss-ppm "$loss_ppm" --seed "$i" 2>"${queue_logs[-1]}")
    queues+=("$!")
    line=""
    read -r -t 10 -u "$qfd" line || true
    exec {qfd}<&-
    [ "$line" = ready ] || die "the queue program did not start in $n: $(cat "${queue_logs[-1]}")"
    ip netns exec "$n" iptables -A INPUT -i "$v" -j NFQUEUE --queue-num 0 ||
      die "iptables could not add the NFQUEUE rule in $n"
  fi
  shape "$v" 1 ip netns exec "$n"   # what the host sends
  shape "$h" 0                      # what it receives
  map+="${map:+ }$ip=$n=host-$i"
done

export NETEM_HOSTS="${ips[*]}"
export NETEM_NAMESPACES="${ns[*]}"
NETEM_SSH="$(cd "$here/../multihost" && pwd)/netns-ssh"
export NETEM_SSH
export SHOAL_NETNS_MAP="$map"
export NETEM_RATE="$rate"
export NETEM_DELAY="$delay"
export NETEM_LOSS="$loss"
echo "$me: $hosts hosts ($NETEM_HOSTS), rate $rate${delay:+, delay $delay}${loss:+, loss $loss}${emulation:+ (delay/loss by $emulation)}" >&2

# In the background so that a signal (ctest's timeout, ^C) reaches the traps above at once;
# stdin passed on explicitly (a background command would get /dev/null).
set +e
"$@" <&0 &
child=$!
wait "$child"
rc=$?
child=""
exit "$rc"
