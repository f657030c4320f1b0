#!/usr/bin/env python3
"""Overhead of the timeline (SHOAL_TRACE) or of the flight recorder (SHOAL_FLIGHT_DIR, --mode
flight) on Shoal's all-reduce: the same benchmark with and without it, alternated run by run, the
median over runs of each run's median latency per size, and the ratio on / off. Writes
bench/results/trace_overhead.{md,jsonl} (flight: bench/results/flight_recorder.{md,jsonl}).

  bench/run_trace_overhead.py [--mode trace|flight] [--build build] [--ranks 2,4] [--runs 7]
                              [--bench-reps 9]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


# What each mode turns on: the variable that names the folder.
VARIABLES = {"trace": "SHOAL_TRACE", "flight": "SHOAL_FLIGHT_DIR"}
WHAT = {"trace": "timeline", "flight": "flight recorder"}


def run_once(bench, ranks, variable, folder, reps):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    for v in VARIABLES.values():
        env.pop(v, None)
    if folder:
        env[variable] = folder
    out = subprocess.run(
        [bench, "-n", str(ranks), "--algorithms", "auto", "--max-bytes", str(4 << 20), "--reps", str(reps)],
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
    ap.add_argument("--runs", type=int, default=7)
    # Small operations are bimodal run to run (two ranks on two cores meet either spinning or
    # after a yield): 9 calibrated repetitions per run, the median of 7 runs.
    ap.add_argument("--bench-reps", type=int, default=9)
    ap.add_argument("--mode", choices=sorted(VARIABLES), default="trace")
    ap.add_argument("--out", help="output path without extension (default: by mode)")
    a = ap.parse_args()
    variable = VARIABLES[a.mode]
    if not a.out:
        # The trace's table goes beside bench/results/observability.md, which is written by
        # hand around it.
        name = "trace_overhead" if a.mode == "trace" else "flight_recorder"
        a.out = os.path.join(HERE, "results", name)
    bench = os.path.join(a.build, "bench", "shoal_allreduce_bench")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in [int(x) for x in a.ranks.split(",")]:
            plain, traced = {}, {}
            for i in range(a.runs):
                for b, us in run_once(bench, ranks, variable, None, a.bench_reps).items():
                    plain.setdefault(b, []).append(us)
                folder = os.path.join(tmp, f"t{ranks}-{i}")
                for b, us in run_once(bench, ranks, variable, folder, a.bench_reps).items():
                    traced.setdefault(b, []).append(us)
            for b in sorted(plain):
                p, t = statistics.median(plain[b]), statistics.median(traced[b])
                rows.append({"bytes": b, "ranks": ranks, "runs": a.runs, "untraced_us": p,
                             "traced_us": t, "ratio": t / p})
    with open(a.out + ".jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    lines = [
        f"# Observability overhead: the {WHAT[a.mode]} ({variable}) on the all-reduce benchmark",
        "",
        f"`bench/run_trace_overhead.py --mode {a.mode}`: `shoal_allreduce_bench -n N --algorithms"
        f" auto` (shared memory, one host), the same binary with and without `{variable}`,"
        f" alternated run by run; each figure is the median over {a.runs} runs of the run's median"
        f" latency (the benchmark's own {a.bench_reps} calibrated repetitions). Ratio: on / off."
        " Target"
        " (issue 16): at most 1.02.",
        "",
        "| ranks | bytes | off (us) | on (us) | ratio |",
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
