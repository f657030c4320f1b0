#!/usr/bin/env python3
"""Runs the point-to-point benchmark side by side between two local ranks: Shoal's comm::send /
comm::recv over shared memory and over TCP, and OpenMPI's MPI_Send / MPI_Recv / MPI_Sendrecv
over its shared-memory BTL (vader: defaults, and with the glibc huge-page malloc tunable) and
over its TCP BTL. Measures ping-pong latency (8 B - 4 KiB), one-way bandwidth and both-ways
bandwidth (64 KiB - 64 MiB). Every message is checked by the benchmark programs
(bench/bench_common.h, Note [Self-checking]); a wrong message or a failed rank fails this
script. The configurations run interleaved, --runs times; tables give the median over runs of
each run's median. Writes bench/results/p2p.md and p2p.jsonl.

Full run (about 5 minutes on the 2-core machine; must stay under 8):
    bench/run_p2p.py --build build
Smoke run (seconds; checks the whole pipeline, writes to a temporary directory):
    bench/run_p2p.py --build build --smoke
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_allreduce import HUGETLB, human, machine, mpirun, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def configs(b, common, exchange, encrypt):
    """(impl, label, setting, command, env) for each configuration."""
    shoal = os.path.join(b, "shoal_p2p_bench")
    mpi = os.path.join(b, "mpi_p2p_bench")
    out = []
    for transport in ("shm", "tcp"):
        out.append(("shoal", transport, "defaults",
                    [shoal, "--transport", transport, "--exchange", exchange] + common, {}))
    if encrypt:
        out.append(("shoal", "tcp+tls", "SHOAL_ENCRYPT=1",
                    [shoal, "--transport", "tcp", "--encrypt", "on", "--exchange", exchange]
                    + common, {}))
    for label, setting, kw in (
            ("vader", "--mca btl self,vader (shared memory, CMA single copy)", {"btl": "self,vader"}),
            ("vader+hugetlb", f"--mca btl self,vader, GLIBC_TUNABLES={HUGETLB}",
             {"btl": "self,vader", "hugetlb": True}),
            ("tcp", "--mca btl self,tcp (loopback)", {"btl": "self,tcp"})):
        pre, env = mpirun(2, **kw)
        out.append(("openmpi", label, setting, pre + [mpi, "--variant", label] + common, env))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs of every configuration")
    ap.add_argument("--reps", type=int, default=5, help="measurements per size and run")
    ap.add_argument("--min-seconds", type=float, default=0.2,
                    help="lower bound on the duration of one measurement")
    ap.add_argument("--bandwidth-max-bytes", type=int, default=64 << 20)
    ap.add_argument("--exchange", default="isend", choices=("serial", "async", "isend"),
                    help="how Shoal posts both-ways transfers (p2p_shoal_bench.cpp, Note [Both "
                    "ways at once])")
    ap.add_argument("--encrypt", action="store_true",
                    help="add a Shoal tcp+tls configuration (TCP links in TLS, SHOAL_ENCRYPT=1)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny settings (1 run, 2 reps, 10 ms, up to 1 MiB) into a temporary --out")
    ap.add_argument("--out", default=None, help="results directory (default bench/results)")
    a = ap.parse_args()
    if a.smoke:
        a.runs, a.reps, a.min_seconds, a.bandwidth_max_bytes = 1, 2, 0.01, 1 << 20
    if a.out is None:
        a.out = tempfile.mkdtemp(prefix="shoal-bench-") if a.smoke else os.path.join(HERE, "results")
    b = os.path.join(a.build, "bench")
    common = ["--reps", str(a.reps), "--min-seconds", str(a.min_seconds),
              "--bandwidth-max-bytes", str(a.bandwidth_max_bytes)]
    started = time.monotonic()
    rows = []
    cfgs = configs(b, common, a.exchange, a.encrypt)
    for run_index in range(a.runs):
        for impl, label, setting, cmd, env in cfgs:
            for r in run(cmd, env):
                r.update({"run": run_index, "config": label, "setting": setting})
                rows.append(r)
    elapsed = time.monotonic() - started
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "p2p.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    write_report(rows, cfgs, os.path.join(a.out, "p2p.md"), a, elapsed)


def combine(rows):
    """{(impl, config, mode, bytes): summary over runs} with the median of the run medians."""
    groups = {}
    for r in rows:
        groups.setdefault((r["impl"], r["config"], r["mode"], r["bytes"]), []).append(r)
    out = {}
    for k, rs in groups.items():
        us = [r["median_us"] for r in rs]
        med = statistics.median(us)
        out[k] = {"us": med, "runs": len(rs), "lo": min(us), "hi": max(us),
                  "variant": rs[0]["variant"],
                  "gbs": (2.0 if k[2] == "bothways" else 1.0) * k[3] / (med * 1e-6) / 1e9}
    return out


def write_report(rows, cfgs, path, a, elapsed):
    s = combine(rows)
    labels = [(impl, label) for impl, label, *_ in cfgs]
    L = ["# Point-to-point benchmark", ""]
    L.append(f"Machine: {machine()}. Run {datetime.date.today().isoformat()} by `bench/run_p2p.py` "
             f"({elapsed / 60:.1f} minutes); raw rows in `p2p.jsonl`.")
    L.append("")
    L.append(
        f"Two ranks as processes on one host. Every configuration ran {a.runs} time(s), "
        "interleaved; in each run each size is measured "
        f"{a.reps} times, a measurement lasting at least {a.min_seconds:g} s (calls per measurement "
        "calibrated per size). Tables give the median over runs of each run's median (the "
        "range over runs in brackets where there are several). Latency is half the ping-pong "
        "round trip (osu_latency). One way: rank 0 sends a stream of messages, rank 1 acknowledges "
        "the last with 8 bytes (MPI_Send / comm::send, blocking). Both ways: each call sends one "
        "message each way; the aggregate of both directions is reported (osu_bibw); OpenMPI uses "
        "MPI_Sendrecv.")
    L.append("")
    L.append(
        "Every message carries a stamp (measurement, call, sender) that the receiver checks after "
        "every receive, and the last message of each measurement is compared byte by byte with "
        "the sender's pattern; a wrong byte fails the run.")
    L.append("")
    L.append("Configurations:")
    L.append("")
    for impl, label, setting, *_ in cfgs:
        L.append(f"- {impl} `{label}`: {setting}")
    exch = {"serial": "Shoal's both-ways rows post comm::sendAsync / comm::recvAsync ordered by "
                      "rank (rank 0 sends first), because today both run one at a time on the "
                      "group's executor: the two directions take turns, so these rows are a lower "
                      "bound until non-blocking isend/irecv replace them.",
            "async": "Shoal's both-ways rows post comm::sendAsync then comm::recvAsync on both "
                     "ranks.",
            "isend": "Shoal's both-ways rows post comm::isend and comm::irecv on both ranks and "
                     "wait for both."}[a.exchange]
    L += ["", exch]

    def cell(key, field, fmt):
        v = s.get(key)
        if not v:
            return "-"
        text = fmt.format(v[field])
        if v["runs"] > 1:
            lo, hi = (v["lo"], v["hi"]) if field == "us" else (
                (2.0 if key[2] == "bothways" else 1.0) * key[3] / (v["hi"] * 1e-6) / 1e9,
                (2.0 if key[2] == "bothways" else 1.0) * key[3] / (v["lo"] * 1e-6) / 1e9)
            text += f" ({fmt.format(lo)}-{fmt.format(hi)})"
        return text

    def best_vader(mode, size):
        c = [s[k] for k in s if k[0] == "openmpi" and k[1].startswith("vader") and k[2] == mode
             and k[3] == size]
        return min(c, key=lambda v: v["us"]) if c else None

    sections = (("pingpong", "Latency (half round trip), us", "us", "{:.2f}"),
                ("oneway", "One-way bandwidth, GB/s", "gbs", "{:.2f}"),
                ("bothways", "Both ways at once, aggregate GB/s", "gbs", "{:.2f}"))
    for mode, title, field, fmt in sections:
        sizes = sorted({k[3] for k in s if k[2] == mode})
        if not sizes:
            continue
        L += ["", f"## {title}", ""]
        L.append("| size | " + " | ".join(f"{i} {l}" for i, l in labels)
                 + " | Shoal shm vs best OpenMPI vader |")
        L.append("|---|" + "---|" * (len(labels) + 1))
        for size in sizes:
            cells = [human(size)] + [cell((i, l, mode, size), field, fmt) for i, l in labels]
            sh, bv = s.get(("shoal", "shm", mode, size)), best_vader(mode, size)
            # > 1 means Shoal is better (lower latency, higher bandwidth).
            cells.append(f"**{bv['us'] / sh['us']:.2f}x**" if sh and bv else "-")
            L.append("| " + " | ".join(cells) + " |")
    L += targets(s, best_vader)
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def targets(s, best_vader):
    L = ["", "## Targets (issue 10), checked against this run", "",
         "| target | measured | met |", "|---|---|---|"]
    sizes = sorted(k[3] for k in s if k[0] == "shoal" and k[1] == "shm" and k[2] == "oneway"
                   and k[3] >= 1 << 20)
    if sizes:
        ratios = [(best_vader("oneway", z)["us"] / s[("shoal", "shm", "oneway", z)]["us"], z)
                  for z in sizes if best_vader("oneway", z)]
        worst = min(ratios)
        L.append(f"| shm one-way bandwidth >= OpenMPI vader's at every size >= 1 MiB | lowest "
                 f"{worst[0]:.2f}x (at {human(worst[1])}) | {'yes' if worst[0] >= 1 else 'no'} |")
    sh, bv = s.get(("shoal", "shm", "pingpong", 8)), best_vader("pingpong", 8)
    if sh and bv:
        r = sh["us"] / bv["us"]
        L.append(f"| 8 B ping-pong latency <= 1.2x OpenMPI vader's | {sh['us']:.2f} us vs "
                 f"{bv['us']:.2f} us: {r:.2f}x | {'yes' if r <= 1.2 else 'no'} |")
    return L


if __name__ == "__main__":
    main()
