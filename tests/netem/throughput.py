#!/usr/bin/env python3
"""Measures what one TCP stream carries from host 2 to host 1 of an emulated network, to check
that with_network.sh's shaping holds the rate (stdlib only; run it as with_network.sh's COMMAND):

    tests/netem/with_network.sh --hosts 2 --rate 100mbit -- tests/netem/throughput.py

The receiver runs on host 1, the sender on host 2 (both through $NETEM_SSH); the sender writes
for --seconds, the receiver times from its first byte to the last and prints MB/s (10^6 bytes)
and Mbit/s next to NETEM_RATE. With --min-fraction F it exits 1 unless the measured rate is
within [F, 1.05] x NETEM_RATE.
"""
import argparse
import os
import re
import subprocess
import sys

RECEIVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(30)
print("listening", flush=True)
c, _ = s.accept(); c.settimeout(30)
buf = bytearray(1 << 20); total = 0; first = last = None
while True:
    n = c.recv_into(buf)
    if not n: break
    last = time.monotonic()
    if first is None: first = last; n0 = n
    total += n
print(f"{total - n0} {last - first}", flush=True)
"""
SENDER = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
chunk = b"\0" * (1 << 20); end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end: c.sendall(chunk)
c.close()
"""


def rate_bits(rate):
    m = re.fullmatch(r"(\d+)(k|m|g)bit", rate)
    return int(m.group(1)) * {"k": 10**3, "m": 10**6, "g": 10**9}[m.group(2)] if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="how long the sender writes")
    ap.add_argument("--port", type=int, default=45678)
    ap.add_argument("--min-fraction", type=float, default=None)
    a = ap.parse_args()
    ssh, hosts = os.environ["NETEM_SSH"], os.environ["NETEM_HOSTS"].split()
    if len(hosts) < 2:
        raise SystemExit("throughput.py: needs 2 hosts")
    timeout = a.seconds + 60
    recv = subprocess.Popen([ssh, hosts[0], "python3 -c '%s' %s %d" % (RECEIVER, hosts[0], a.port)],
                            stdout=subprocess.PIPE, text=True)
    try:
        if recv.stdout.readline().strip() != "listening":
            raise SystemExit("throughput.py: the receiver did not start")
        subprocess.run([ssh, hosts[1], "python3 -c '%s' %s %d %g" % (SENDER, hosts[0], a.port,
                                                                      a.seconds)],
                       check=True, timeout=timeout)
        out, _ = recv.communicate(timeout=timeout)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait(timeout=10)
    nbytes, secs = out.split()
    mbs = int(nbytes) / float(secs) / 1e6
    want = rate_bits(os.environ.get("NETEM_RATE", ""))
    line = f"{mbs:.2f} MB/s = {mbs * 8:.1f} Mbit/s over {float(secs):.1f} s"
    if want:
        line += f" (NETEM_RATE {os.environ['NETEM_RATE']} = {want / 8e6:.2f} MB/s: " \
                f"{mbs * 8e6 / want:.1%})"
    print(line)
    if a.min_fraction is not None and want and not a.min_fraction <= mbs * 8e6 / want <= 1.05:
        print(f"throughput.py: FAIL: not within [{a.min_fraction}, 1.05] x the rate",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
