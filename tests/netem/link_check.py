#!/usr/bin/env python3
"""Checks the delay and the integrity of the link between hosts 2 and 1 of an emulated network
(stdlib only; run it as with_network.sh's COMMAND):

    tests/netem/with_network.sh --hosts 2 --delay 5ms -- tests/netem/link_check.py \
        --rtt-min-ms 10 --rtt-max-ms 60

An echo server on host 1 (its port chosen by the OS and passed on), a client on host 2: ROUNDS
round trips of one byte (TCP_NODELAY), then BYTES of random data sent and their SHA-256 compared
with what the server received. Prints the median round trip and the transfer's rate; exits 1 when
the median is outside [--rtt-min-ms, --rtt-max-ms] or the bytes differ.
"""
import argparse
import os
import subprocess
import sys

SERVER = r"""
import hashlib, socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); s.settimeout(60)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.settimeout(60)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rounds, size = int(sys.argv[2]), int(sys.argv[3])
for _ in range(rounds):
    b = c.recv(1)
    if not b: raise SystemExit("echo: closed early")
    c.sendall(b)
h = hashlib.sha256(); left = size
while left:
    b = c.recv(min(left, 1 << 20))
    if not b: raise SystemExit("echo: closed before all bytes came")
    h.update(b); left -= len(b)
c.sendall(h.hexdigest().encode())
c.close()
"""
CLIENT = r"""
import hashlib, os, socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rounds, size = int(sys.argv[3]), int(sys.argv[4])
rtts = []
for _ in range(rounds):
    t = time.monotonic(); c.sendall(b"x")
    if c.recv(1) != b"x": raise SystemExit("client: bad echo")
    rtts.append(time.monotonic() - t)
data = os.urandom(size)
t = time.monotonic(); c.sendall(data)
got = b""
while len(got) < 64:
    b = c.recv(64 - len(got))
    if not b: raise SystemExit("client: no digest")
    got += b
secs = time.monotonic() - t
print(statistics.median(rtts) * 1e3, secs, hashlib.sha256(data).hexdigest() == got.decode())
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--bytes", type=int, default=4 << 20)
    ap.add_argument("--rtt-min-ms", type=float, default=0.0)
    ap.add_argument("--rtt-max-ms", type=float, default=1e9)
    a = ap.parse_args()
    ssh, hosts = os.environ["NETEM_SSH"], os.environ["NETEM_HOSTS"].split()
    if len(hosts) < 2:
        raise SystemExit("link_check.py: needs 2 hosts")
    server = subprocess.Popen(
        [ssh, hosts[0], "python3 -c '%s' %s %d %d" % (SERVER, hosts[0], a.rounds, a.bytes)],
        stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise SystemExit("link_check.py: the server did not start")
        out = subprocess.run(
            [ssh, hosts[1], "python3 -c '%s' %s %s %d %d" % (CLIENT, hosts[0], port, a.rounds,
                                                             a.bytes)],
            check=True, timeout=300, capture_output=True, text=True).stdout
        if server.wait(timeout=60) != 0:
            raise SystemExit("link_check.py: the server failed")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)
    rtt, secs, same = out.split()
    rtt, secs = float(rtt), float(secs)
    print(f"link_check.py: median round trip {rtt:.2f} ms over {a.rounds}; {a.bytes} bytes in "
          f"{secs:.2f} s ({a.bytes / secs / 1e6:.1f} MB/s), "
          f"{'intact' if same == 'True' else 'CHANGED'}")
    ok = True
    if not a.rtt_min_ms <= rtt <= a.rtt_max_ms:
        print(f"link_check.py: FAIL: round trip {rtt:.2f} ms not within "
              f"[{a.rtt_min_ms}, {a.rtt_max_ms}] ms", file=sys.stderr)
        ok = False
    if same != "True":
        print("link_check.py: FAIL: the bytes received differ from those sent", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
