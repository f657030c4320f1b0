#!/usr/bin/env python3
"""The timeline's cost on the all-reduce, with the ring's cache misses told apart: the same
benchmark untraced, traced with the default ring (100,000 spans, 40 MB) and traced with a ring of
1000 spans (SHOAL_TRACE_EVENTS=1000, which stays in cache), interleaved run by run. Prints, per
size, the median over RUNS runs of each run's median latency (9 calibrated repetitions) and the
ratio to untraced. The table in bench/results/observability.md ("The timeline on the all-reduce
benchmark") is its output.

  python3 bench/run_trace_ring_ab.py RANKS RUNS MAX_BYTES     e.g. 2 7 1048576
"""
import json
import os
import statistics
import subprocess
import sys

BENCH = "build/bench/shoal_allreduce_bench"
MODES = {"off": {}, "on": {"SHOAL_TRACE": "/tmp/trace-ring-ab"},
         "on-1k": {"SHOAL_TRACE": "/tmp/trace-ring-ab-1k", "SHOAL_TRACE_EVENTS": "1000"}}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ranks, runs, max_bytes = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    results = {m: {} for m in MODES}
    for _ in range(runs):
        for mode, extra in MODES.items():
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **extra)
            out = subprocess.run([BENCH, "-n", str(ranks), "--algorithms", "auto", "--max-bytes",
                                  max_bytes, "--reps", "9"], env=env, capture_output=True,
                                 text=True, timeout=600)
            if out.returncode != 0:
                sys.exit(f"{mode}: exit {out.returncode}: {out.stderr[-2000:]}")
            for line in out.stdout.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    if not row["verified"]:
                        sys.exit(f"{mode}: unverified result at {row['bytes']} bytes")
                    results[mode].setdefault(row["bytes"], []).append(row["median_us"])
    for size in sorted(results["off"]):
        off = statistics.median(results["off"][size])
        cells = [f"{m} {statistics.median(results[m][size]):.2f} "
                 f"({statistics.median(results[m][size]) / off:.3f})" for m in MODES]
        print(size, " ".join(cells))


if __name__ == "__main__":
    main()
