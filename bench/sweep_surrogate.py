#!/usr/bin/python3
"""A tabular stand-in for build/fashion_mnist, for comparing search algorithms over many seeds.

The real training program takes 10-60 s a trial on this machine, so sweep_vs_optuna.py can run
only a few seeds of it, and a 1-point gap between two searchers stays within the noise. But the
program is deterministic (--seed 0), so its answer is a function of (lr, batch, optimizer): this
script replays that function from a table measured once by a grid sweep of the real program
(bench/testdata/fashion_surface.json, written by `--build-table`), interpolating linearly in
log(lr) between the grid's learning rates. It takes the real program's flags, writes the same
--metrics lines (epoch, test_accuracy) and spends a fixed fraction (--time-scale) of the real
epoch's measured time per epoch, so trials finish in the same order relative to each other as
real ones do and the searchers' pruning still races them.

  # the table, from a grid sweep of fashion_mnist (see bench/results/sweep_vs_optuna.md)
  bench/sweep_surrogate.py --build-table SWEEP_DIR > bench/testdata/fashion_surface.json
  # one trial (what the sweeps run)
  bench/sweep_surrogate.py --table T --lr 0.001 --batch 32 --optimizer adam --epochs 2 \
      --metrics m.jsonl [--time-scale 0.05] [other fashion_mnist flags, ignored]
"""
import argparse
import bisect
import json
import math
import os
import sys
import time

DEFAULT_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata",
                             "fashion_surface.json")


def build_table(sweep_dir):
    """The grid sweep's completed trials: per (batch, optimizer), lr -> per-epoch accuracy and
    seconds (from each trial's own metrics file, which has the epoch times)."""
    rows = []
    with open(os.path.join(sweep_dir, "trials.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            if e["event"] != "end":
                continue
            if e["status"] != "completed":
                sys.exit(f"trial {e['trial']} of the grid is {e['status']}: rerun it first")
            path = os.path.join(sweep_dir, f"trial-{e['trial']:04d}", "metrics.jsonl")
            with open(path) as m:
                epochs = [json.loads(l) for l in m if l.strip()]
            rows.append({"lr": e["params"]["lr"], "batch": e["params"]["batch"],
                         "optimizer": e["params"]["optimizer"],
                         "accuracy": [x["test_accuracy"] for x in epochs],
                         "epoch_seconds": [x["epoch_seconds"] for x in epochs]})
    rows.sort(key=lambda r: (r["batch"], r["optimizer"], r["lr"]))
    json.dump({"program": "fashion_mnist --epochs 2 --train-subset 2048 --threads 1 --seed 0",
               "rows": rows}, sys.stdout, indent=1)
    print()


def lookup(table, lr, batch, optimizer):
    """(accuracy per epoch, seconds per epoch), interpolated in log(lr) and clamped at the ends."""
    rows = [r for r in table["rows"] if r["batch"] == batch and r["optimizer"] == optimizer]
    if not rows:
        sys.exit(f"sweep_surrogate: no row for batch {batch}, optimizer {optimizer}")
    xs = [math.log(r["lr"]) for r in rows]
    x = min(max(math.log(lr), xs[0]), xs[-1])
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    lo, hi = rows[i - 1], rows[i]
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])

    def mix(key):
        return [(1 - t) * a + t * b for a, b in zip(lo[key], hi[key])]

    return mix("accuracy"), mix("epoch_seconds")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build-table", metavar="SWEEP_DIR")
    p.add_argument("--table", default=os.environ.get("SWEEP_SURROGATE_TABLE", DEFAULT_TABLE))
    p.add_argument("--lr", type=float)
    p.add_argument("--batch", type=int)
    p.add_argument("--optimizer")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--metrics")
    p.add_argument("--time-scale", type=float,
                   default=float(os.environ.get("SWEEP_SURROGATE_TIME_SCALE", "0.1")))
    a, _ = p.parse_known_args()  # the real program's other flags mean nothing here
    if a.build_table:
        return build_table(a.build_table)
    if a.lr is None or a.batch is None or a.optimizer is None or not a.metrics:
        sys.exit("sweep_surrogate: --lr, --batch, --optimizer and --metrics are required")
    with open(a.table) as f:
        table = json.load(f)
    accuracy, seconds = lookup(table, a.lr, a.batch, a.optimizer)
    if a.epochs > len(accuracy):
        sys.exit(f"sweep_surrogate: the table has {len(accuracy)} epochs, asked for {a.epochs}")
    with open(a.metrics, "a") as out:
        for epoch in range(a.epochs):
            # Stands in for the epoch's training: the searchers race trials by their finish order.
            time.sleep(seconds[epoch] * a.time_scale)
            out.write(json.dumps({"epoch": epoch + 1, "test_accuracy": accuracy[epoch]}) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
