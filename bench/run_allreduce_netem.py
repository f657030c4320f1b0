#!/usr/bin/env python3
"""All-reduce algorithms compared on emulated multi-host networks. For each link rate, each
algorithm runs as one job of HOSTS x RANKS ranks (default 2 x 2) under
tests/netem/with_network.sh (hosts as network namespaces, each host's link shaped both ways with
tc tbf), started by `shoal run --hosts ... --ssh $NETEM_SSH`: the Shoal all-reduce benchmark
(bench/shoal_allreduce_bench.cpp, float32 sum, every result verified) with --transport auto, so
ranks of one host share memory and hosts talk TCP (TLS under SHOAL_ENCRYPT=auto, the default).
The algorithm is forced with SHOAL_ALLREDUCE_ALGORITHM (the benchmark calls with "auto", which
defers to it). Each size is measured --reps times (each measurement keeps the slowest rank's
time) and the median is reported; busbw = size / time x 2(n-1)/n (nccl-tests).

Prints a markdown table per rate (busbw GB/s per size x algorithm, and each algorithm's busbw
over the first algorithm's) and writes it to --out. Needs root (network namespaces).

Full run (12-14 minutes on the 2-core machine: the ring's job alone at 100 Mbit/s takes 6.6, as
256 MiB takes 35 s per ring all-reduce and the benchmark makes 2 + 2 x reps calls per size):
    bench/run_allreduce_netem.py --build build --out /tmp/allreduce_netem.md
Plumbing check (a minute):
    bench/run_allreduce_netem.py --build build --algorithms ring,rabenseifner --sizes 1,4 \\
        --out /tmp/netem_check.md
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WITH_NETWORK = os.path.join(HERE, "..", "tests", "netem", "with_network.sh")
MIB = 1 << 20

# Runs inside with_network.sh (bash -c INNER inner RANKS COMMAND...), where the hosts are known:
# puts the --hosts list built from NETEM_HOSTS ("ip:RANKS,...") where COMMAND has @HOSTS@, and
# NETEM_SSH where it has @SSH@.
INNER = r'''
ranks="$1"; shift
list=""
for ip in $NETEM_HOSTS; do list+="${list:+,}$ip:$ranks"; done
set -- "${@//@HOSTS@/$list}"
exec "${@//@SSH@/$NETEM_SSH}"
'''


def rate_bytes_per_s(rate):
    m = re.fullmatch(r"(\d+)(k|m|g)bit", rate)
    if not m:
        raise SystemExit(f"--rates: '{rate}' is not a whole number of kbit, mbit or gbit")
    return int(m.group(1)) * {"k": 10**3, "m": 10**6, "g": 10**9}[m.group(2)] / 8


def job_timeout(a, rate, sizes):
    """Seconds one job may take: generous (4x the size crossing the link per call, 2x slack,
    plus start-up), but bounded, so that a hung job fails the run instead of stalling it."""
    calls = 2 + 2 * a.reps  # calibration (2), then a verified and a timed call per measurement
    wire = sum(4 * s for s in sizes) * calls / rate_bytes_per_s(rate)
    return int(180 + 2 * wire + calls * len(sizes) * a.min_seconds * 4)


def run_job(a, rate, algorithm, sizes):
    """One job; returns rank 0's rows (JSON, one per size). Fails loudly on a non-zero exit."""
    limit = job_timeout(a, rate, sizes)
    bench = os.path.join(a.build, "bench", "shoal_allreduce_bench")
    shoal = os.path.join(a.build, "shoal")
    for path in (bench, shoal):
        if not os.access(path, os.X_OK):
            raise SystemExit(f"{path} not found: build the targets shoal and shoal_allreduce_bench")
    delay = ["--delay", a.delay] if a.delay else []
    cmd = [WITH_NETWORK, "--hosts", str(a.hosts), "--rate", rate, *delay, "--",
           "bash", "-c", INNER, "inner", str(a.ranks_per_host),
           shoal, "run", "-q", "--hosts", "@HOSTS@", "--ssh", "@SSH@",
           "--timeout", str(a.rank_timeout), "--time-limit", str(limit - 30),
           "-x", f"SHOAL_ALLREDUCE_ALGORITHM={algorithm}", "-x", f"SHOAL_ENCRYPT={a.encrypt}",
           "--", bench, "--transport", "auto", "--algorithms", "auto",
           "--reps", str(a.reps), "--min-seconds", str(a.min_seconds),
           "--max-bytes", str(max(sizes))]
    print(f"+ {rate} {algorithm}: {' '.join(cmd[cmd.index('inner') + 2:])}", file=sys.stderr,
          flush=True)
    started = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{rate} {algorithm}: the job ran past {limit} s")
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        raise SystemExit(f"{rate} {algorithm}: the job exited {out.returncode}")
    rows = []
    for line in out.stdout.splitlines():
        m = re.match(r"\[0\] (\{.*\})$", line.strip())
        if m:
            r = json.loads(m.group(1))
            if r["bytes"] in sizes:
                r.update(rate=rate, algorithm=algorithm, encrypt=a.encrypt)
                rows.append(r)
    got = sorted(r["bytes"] for r in rows)
    if got != sorted(sizes):
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        raise SystemExit(f"{rate} {algorithm}: results for {got} bytes, expected {sorted(sizes)}")
    print(f"  {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return rows


def human(b):
    return f"{b // MIB} MiB" if b >= MIB and b % MIB == 0 else f"{b // 1024} KiB"


def report(rows, a, rates, algorithms, sizes, elapsed):
    n = a.hosts * a.ranks_per_host
    base = algorithms[0]
    L = ["# All-reduce on an emulated multi-host network", ""]
    L.append(f"{a.hosts} hosts x {a.ranks_per_host} ranks (n = {n}) on one machine "
             f"({os.cpu_count()} cores, Linux {platform.release()}), "
             f"{datetime.date.today().isoformat()}, `bench/run_allreduce_netem.py` "
             f"({elapsed / 60:.1f} minutes). Hosts are network namespaces "
             "(`tests/netem/with_network.sh`); each host's link is shaped to the rate in both "
             "directions (tc tbf), "
             + (f"with {a.delay} one way between hosts (round trip {a.delay} x 2; "
                "`--delay`: sch_netem, or where the kernel lacks it the netfilter queue of "
                "`tests/netem/netem_queue.cpp`)" if a.delay else "no added delay")
             + ". Ranks of a host share memory; hosts talk "
             f"TCP (SHOAL_ENCRYPT={a.encrypt}). float32 sum, in place; median of {a.reps} "
             "measurements (each the slowest rank's time, every result verified); "
             "busbw = size / time x 2(n-1)/n, in GB/s (10^9 bytes/s), time in ms in parentheses. "
             f"Ratios are busbw over {base}'s (> 1: faster than {base}).")
    for rate in rates:
        link = rate_bytes_per_s(rate) / 1e9
        L += ["", f"## {rate} ({link:.4g} GB/s per host link and direction)", ""]
        others = algorithms[1:]
        head = (["size"] + [f"{x} busbw (ms)" for x in algorithms]
                + [f"{x} / {base}" for x in others])
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "---|" * len(head))
        for s in sizes:
            got = {r["algorithm"]: r for r in rows if r["rate"] == rate and r["bytes"] == s}
            cells = [human(s)]
            for x in algorithms:
                r = got.get(x)
                cells.append(f"{r['busbw']:.4f} ({r['median_us'] / 1e3:.1f})" if r else "-")
            for x in others:
                r, b = got.get(x), got.get(base)
                cells.append(f"**{r['busbw'] / b['busbw']:.2f}x**" if r and b else "-")
            L.append("| " + " | ".join(cells) + " |")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--out", required=True, help="the markdown report")
    ap.add_argument("--jsonl", default=None, help="also write the raw rows here")
    ap.add_argument("--rates", default="1gbit,100mbit", help="comma-separated tc rates")
    ap.add_argument("--algorithms", default="ring,hierarchical",
                    help="comma-separated SHOAL_ALLREDUCE_ALGORITHM values; the first is the "
                    "baseline of the ratios")
    ap.add_argument("--sizes", default="1,4,16,64,256", help="comma-separated MiB (float32)")
    ap.add_argument("--reps", type=int, default=3, help="measurements per size (median; >= 3)")
    ap.add_argument("--min-seconds", type=float, default=0.2,
                    help="lower bound on one measurement (more calls for small sizes)")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--delay", default="",
                    help="one-way delay between hosts, e.g. 0.2ms (with_network.sh --delay)")
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--encrypt", default="auto", choices=["auto", "0", "1"],
                    help="SHOAL_ENCRYPT for the ranks (auto: TLS across hosts)")
    ap.add_argument("--rank-timeout", type=int, default=600,
                    help="shoal run --timeout: seconds any one wait of a rank may last")
    a = ap.parse_args()
    rates = [x for x in a.rates.split(",") if x]
    algorithms = [x for x in a.algorithms.split(",") if x]
    sizes = sorted({int(float(x) * MIB) for x in a.sizes.split(",") if x})
    if not rates or not algorithms or not sizes:
        ap.error("--rates, --algorithms and --sizes need at least one value each")
    for s in sizes:
        # The benchmark measures powers of 4 from 4 KiB (bench/bench_common.h, defaultSizes).
        k = s // 4096
        if s % 4096 or k == 0 or k & (k - 1) or k.bit_length() % 2 == 0:
            ap.error(f"--sizes: {s / MIB:g} MiB is not one the benchmark measures "
                     "(4 KiB x a power of 4: 1, 4, 16, 64, 256 MiB, ...)")
    for rate in rates:
        rate_bytes_per_s(rate)
    started = time.monotonic()
    rows = []
    for rate in rates:
        for algorithm in algorithms:
            rows += run_job(a, rate, algorithm, sizes)
    text = report(rows, a, rates, algorithms, sizes, time.monotonic() - started)
    print(text)
    with open(a.out, "w") as f:
        f.write(text)
    if a.jsonl:
        with open(a.jsonl, "w") as f:
            for r in rows:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
