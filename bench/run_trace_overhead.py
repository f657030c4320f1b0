#!/usr/bin/env python3
"""Overhead of the timeline (SHOAL_TRACE) on Shoal's all-reduce: the same benchmark with and
without tracing, alternated run by run, the median over runs of each run's median latency per
size, and the ratio traced / untraced. Writes bench/results/observability.{md,jsonl}.

  bench/run_trace_overhead.py [--build build] [--ranks 2,4] [--runs 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_once(bench, ranks, trace_dir):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.pop("SHOAL_TRACE", None)
    if trace_dir:
        env["SHOAL_TRACE"] = trace_dir
    out = subprocess.run(
        [bench, "-n", str(ranks), "--algorithms", "auto", "--max-bytes", str(4 << 20), "--reps", "5"],
        env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"benchmark failed ({out.returncode}): {out.stderr[-2000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if not rows or not all(r["verified"] for r in rows):
        sys.exit("benchmark printed no verified rows")
    return {r["bytes"]: r["median_us"] for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--ranks", default="2,4", help="comma-separated rank counts")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "observability"))
    a = ap.parse_args()
    bench = os.path.join(a.build, "bench", "shoal_allreduce_bench")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in [int(x) for x in a.ranks.split(",")]:
            plain, traced = {}, {}
            for i in range(a.runs):
                for b, us in run_once(bench, ranks, None).items():
                    plain.setdefault(b, []).append(us)
                for b, us in run_once(bench, ranks, os.path.join(tmp, f"t{ranks}-{i}")).items():
                    traced.setdefault(b, []).append(us)
            for b in sorted(plain):
                p, t = statistics.median(plain[b]), statistics.median(traced[b])
                rows.append({"bytes": b, "ranks": ranks, "runs": a.runs, "untraced_us": p,
                             "traced_us": t, "ratio": t / p})
    with open(a.out + ".jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    lines = [
        "# Observability overhead: the timeline (SHOAL_TRACE) on the all-reduce benchmark",
        "",
        f"`bench/run_trace_overhead.py`: `shoal_allreduce_bench -n N --algorithms auto`"
        " (shared memory, one host), the same binary with and without `SHOAL_TRACE`, alternated"
        f" run by run; each figure is the median over {a.runs} runs of the run's median latency"
        " (the benchmark's own 5 calibrated repetitions). Ratio: traced / untraced. Target"
        " (issue 16): at most 1.02.",
        "",
        "| ranks | bytes | untraced (us) | traced (us) | ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['bytes']} | {r['untraced_us']:.2f} | {r['traced_us']:.2f} |"
                     f" {r['ratio']:.3f} |")
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
