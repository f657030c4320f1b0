#!/usr/bin/env python3
"""The autotuner's choice against the grid's best (issue 16), on fashion_mnist with 2 ranks.

Grid: every candidate the Trainer's autotune tries (bucket 1 / 4 MiB, overlap on / off,
all-reduce algorithm auto / ring / rabenseifner), pinned by --bucket-mb, --no-overlap and
SHOAL_ALLREDUCE_ALGORITHM, each run REPS times in rep-major order (drift spreads over all
candidates). A run's time: per step the slowest rank's step_time_s (from the run directory's
metrics.db, as the autotuner takes the largest over ranks), then the median over the steps after
WARMUP. A candidate's time: the median over its runs.

Autotune: --autotune runs, their choice read from the printed line and the autotune_choice
metric (step = search cost in steps); the steps after the choice are timed the same way.

Writes bench/results/autotune.jsonl (one line per run, then a summary line) and prints a
Markdown table. Run from the repository root after a build: python3 bench/run_autotune.py
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from run_metrics import series, slowest_rank_step_times

SHOAL = "build/shoal"
EXAMPLE = "build/fashion_mnist"
REPS = int(os.environ.get("REPS", "3"))
AUTOTUNE_REPS = int(os.environ.get("AUTOTUNE_REPS", "3"))
WARMUP = 10  # steps of each grid run not timed
COMMON = ["--train-subset", "4096", "--batch", "32", "-q"]
GRID_EPOCHS = 2  # 128 steps per rank
AUTOTUNE_EPOCHS = 4  # 256 steps: 179 of search, then 77 with the choice
BUCKETS = [1, 4]  # 25 MiB makes 4 MiB's buckets for FashionCnn (README "Autotuning")
ALGORITHMS = ["auto", "ring", "rabenseifner"]


def label(mib, overlap, alg):
    return f"bucket={mib}MiB overlap={'on' if overlap else 'off'} alg={alg}"


def step_times(db):
    return slowest_rank_step_times(db), series(db, "autotune_choice")


def run(args, env_extra):
    d = tempfile.mkdtemp(prefix="autotune-bench-")
    rd = os.path.join(d, "run")
    env = dict(os.environ)
    env.pop("SHOAL_ALLREDUCE_ALGORITHM", None)
    env.update(env_extra)
    t0 = time.time()
    p = subprocess.run([SHOAL, "run", "-n", "2", "--run-dir", rd, "--", EXAMPLE] + COMMON + args,
                       env=env, capture_output=True, text=True, timeout=300)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {args} {env_extra}\n{p.stdout}\n{p.stderr}")
    times, choice = step_times(os.path.join(rd, "metrics.db"))
    subprocess.run(["rm", "-rf", d], check=True)
    return p.stdout + p.stderr, times, choice, wall


def main():
    out = open("bench/results/autotune.jsonl", "w")
    load_before = os.getloadavg()
    started = time.time()
    grid = {}
    for rep in range(REPS):
        for mib in BUCKETS:
            for overlap in (True, False):
                for alg in ALGORITHMS:
                    args = ["--epochs", str(GRID_EPOCHS), "--bucket-mb", str(mib)]
                    if not overlap:
                        args.append("--no-overlap")
                    env = {} if alg == "auto" else {"SHOAL_ALLREDUCE_ALGORITHM": alg}
                    _, times, _, wall = run(args, env)
                    med = statistics.median(t for s, t in times[WARMUP:])
                    name = label(mib, overlap, alg)
                    grid.setdefault(name, []).append(med)
                    rec = {"kind": "grid", "candidate": name, "rep": rep, "steps": len(times),
                           "median_step_ms": med * 1e3, "wall_s": wall}
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                    print(json.dumps(rec), flush=True)
    grid_ms = {k: statistics.median(v) * 1e3 for k, v in grid.items()}
    best = min(grid_ms, key=grid_ms.get)
    tuned = []
    for rep in range(AUTOTUNE_REPS):
        text, times, choice, wall = run(["--epochs", str(AUTOTUNE_EPOCHS), "--autotune"], {})
        m = re.search(r"autotune: chose (bucket=\S+ overlap=\S+ alg=[a-z_]+):", text)
        if not m or len(choice) != 2 or choice[0][2] != choice[1][2]:
            sys.exit(f"no agreed choice:\n{text}\n{choice}")
        chosen = m.group(1)
        cost = int(choice[0][1])
        after = [t for s, t in times if s > cost + 1]  # the choice's own first step not timed
        rec = {"kind": "autotune", "rep": rep, "chosen": chosen, "search_steps": cost,
               "total_steps": len(times), "chosen_grid_ms": grid_ms[chosen],
               "ratio_to_grid_best": grid_ms[chosen] / grid_ms[best],
               "after_choice_median_ms": statistics.median(after) * 1e3 if after else None,
               "wall_s": wall}
        tuned.append(rec)
        out.write(json.dumps(rec) + "\n")
        out.flush()
        print(json.dumps(rec), flush=True)
    summary = {"kind": "summary", "grid_best": best, "grid_best_ms": grid_ms[best],
               "grid_ms": grid_ms, "reps": REPS, "autotune_reps": AUTOTUNE_REPS,
               "load_before": load_before, "load_after": os.getloadavg(),
               "machine_s": time.time() - started}
    out.write(json.dumps(summary) + "\n")
    out.close()
    print("\n| candidate | median step (ms) | runs (ms) | / best |\n|---|---:|---:|---:|")
    for k in sorted(grid_ms, key=grid_ms.get):
        runs = ", ".join(f"{x * 1e3:.2f}" for x in grid[k])
        print(f"| {k} | {grid_ms[k]:.2f} | {runs} | {grid_ms[k] / grid_ms[best]:.3f} |")
    print("\n| autotune run | chosen | its grid time (ms) | / grid best | search steps | "
          "after choice (ms) |\n|---|---|---:|---:|---:|---:|")
    for r in tuned:
        print(f"| {r['rep']} | {r['chosen']} | {r['chosen_grid_ms']:.2f} | "
              f"{r['ratio_to_grid_best']:.3f} | {r['search_steps']} of {r['total_steps']} | "
              f"{r['after_choice_median_ms']:.2f} |")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
