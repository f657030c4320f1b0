#!/usr/bin/env python3
"""What the timeline costs the main job (issue 16's target: at most 2% with tracing on).

The README's main job (fashion_mnist, the CNN, 2 ranks), run in pairs: `shoal run -n 2
--run-dir D -- build/fashion_mnist ARGS` without and with `--trace D/job.json`, alternated (the
order flips every pair, so drift spreads over both). Both track (the run directory), so the
only difference is the timeline. A run's time: per step the slower rank's step_time_s from
D/metrics.db, then the median over the steps after WARMUP; each side's figure is the median over
its runs, and the ratio traced / untraced; the per-pair ratios show the spread. The traced
runs' merged trace says how many spans a step records, which with the cost of one span
(bench/trace_span_cost) is what tracing should add.

  python3 bench/run_trace_job_overhead.py [--pairs 5] [--build build] [--out FILE.jsonl]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from run_metrics import slowest_rank_step_times

WARMUP = 10
ARGS = ["--epochs", "1", "--train-subset", "8192", "-q"]


def step_times(db):
    return [t for s, t in slowest_rank_step_times(db) if s > WARMUP]


def run(build, traced):
    d = tempfile.mkdtemp(prefix="trace-job-")
    rd = os.path.join(d, "run")
    cmd = [os.path.join(build, "shoal"), "run", "-n", "2", "--run-dir", rd]
    trace = os.path.join(d, "job.json")
    if traced:
        cmd += ["--trace", trace]
    cmd += ["--", os.path.join(build, "fashion_mnist")] + ARGS
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    times = step_times(os.path.join(rd, "metrics.db"))
    spans = None
    if traced:
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
        spans = sum(1 for e in events if e.get("ph") in ("X", "b"))
    subprocess.run(["rm", "-rf", d], check=True)
    if not times:
        sys.exit(f"no step times in {rd}/metrics.db")
    return statistics.median(times), len(times) + WARMUP, spans


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="bench/results/trace_job.jsonl")
    a = ap.parse_args()
    load = os.getloadavg()
    rows = []
    for i in range(a.pairs):
        for traced in ([False, True] if i % 2 == 0 else [True, False]):
            median, steps, spans = run(a.build, traced)
            rows.append({"pair": i, "traced": traced, "median_step_s": median, "steps": steps,
                         "spans": spans})
            print(json.dumps(rows[-1]), flush=True)
    plain = statistics.median(r["median_step_s"] for r in rows if not r["traced"])
    traced = statistics.median(r["median_step_s"] for r in rows if r["traced"])
    ratios = []
    for i in range(a.pairs):
        p = next(r for r in rows if r["pair"] == i and not r["traced"])
        t = next(r for r in rows if r["pair"] == i and r["traced"])
        ratios.append(t["median_step_s"] / p["median_step_s"])
    spans = [r["spans"] / (2 * r["steps"]) for r in rows if r["traced"]]
    summary = {"summary": True, "pairs": a.pairs, "untraced_step_s": plain,
               "traced_step_s": traced, "ratio": traced / plain,
               "pair_ratio_median": statistics.median(ratios), "pair_ratio_min": min(ratios),
               "pair_ratio_max": max(ratios), "spans_per_rank_step": statistics.median(spans),
               "load_before": load, "load_after": os.getloadavg(), "args": ARGS,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with open(a.out, "w") as f:
        for r in rows + [summary]:
            f.write(json.dumps(r) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
