#!/usr/bin/python3
"""`shoal sweep --algorithm tpe` with ASHA against Optuna's TPE + SuccessiveHalvingPruner.

The same search space over build/fashion_mnist (lr log-uniform, batch and optimizer choices), the
same trial budget, parallelism, start-up trials and pruning schedule (rungs at min_epochs *
reduction_factor^k, none at the last epoch), and the same trial command: `shoal run -n 1 --
fashion_mnist ...` with --metrics read while it runs. Reported per seed: the best final
test_accuracy among completed trials and the wall time from the sweep's start until the trial
that reached it finished; then medians over seeds.

  /usr/bin/python3 bench/sweep_vs_optuna.py [--shoal build/shoal] [--program build/fashion_mnist]
      [--seeds 1,2,3] [--trials 8] [--parallel 2] [--out bench/results/sweep_vs_optuna]
      [--surrogate [TABLE]] [--shoal-tpe multivariate|univariate] [--optuna-tpe ...]

--surrogate runs the trials on bench/sweep_surrogate.py, which replays fashion_mnist's measured
answers (bench/testdata/fashion_surface.json) in a fraction of the time (its epochs last
SWEEP_SURROGATE_TIME_SCALE of the real ones, 0.1 by default): 20 seeds in minutes, where the
real program affords 4 in a quarter of an hour. Ends with the paired per-seed difference.

Needs python3-optuna (Debian). Keep the machine otherwise idle: trials are timed.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import optuna

DEFAULT_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata",
                             "fashion_surface.json")

SPACE_LR = (1e-4, 0.3)
SPACE_BATCH = [32, 64, 128]
SPACE_OPTIMIZER = ["sgd", "adam"]


def fixed_args(a):
    return ["--epochs", str(a.epochs), "--train-subset", str(a.train_subset), "--threads", "1",
            "-q", "--seed", "0"]


def trial_env():
    env = dict(os.environ)
    env["OPENBLAS_NUM_THREADS"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_shoal(a, seed, workdir):
    config = {
        "command": [a.program] + fixed_args(a),
        "metric": "test_accuracy", "direction": "max",
        "trials": a.trials, "parallel": a.parallel, "ranks_per_trial": 1,
        "trial_time_limit": 300, "algorithm": "tpe", "seed": seed, "grace": 2,
        "tpe": {"startup_trials": a.startup, "multivariate": a.shoal_tpe == "multivariate"},
        "early_stopping": {"type": "asha", "min_epochs": 1, "reduction_factor": a.eta,
                           "max_epochs": a.epochs},
        "env": {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
        "parameters": {
            "lr": {"type": "log_uniform", "low": SPACE_LR[0], "high": SPACE_LR[1]},
            "batch": {"type": "choice", "values": SPACE_BATCH},
            "optimizer": {"type": "choice", "values": SPACE_OPTIMIZER},
        },
    }
    path = os.path.join(workdir, f"shoal-{seed}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    sweep_dir = os.path.join(workdir, f"shoal-{seed}")
    start_ms = time.time() * 1000
    t0 = time.monotonic()
    r = subprocess.run([a.shoal, "sweep", path, "--dir", sweep_dir], capture_output=True,
                       text=True, env=trial_env())
    total = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"shoal sweep failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    ends = []
    with open(os.path.join(sweep_dir, "trials.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            if e["event"] == "end":
                ends.append(e)
    done = [e for e in ends if e["status"] == "completed"]
    best = max(done, key=lambda e: e["metric"])
    return {
        "tool": "shoal", "seed": seed, "best": best["metric"],
        "seconds_to_best": (best["ended_ms"] - start_ms) / 1000, "seconds": total,
        "completed": len(done), "pruned": sum(e["status"] == "pruned" for e in ends),
        "failed": sum(e["status"] == "failed" for e in ends),
        "best_params": best["params"],
    }


def run_optuna(a, seed, workdir):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=a.startup,
                                         multivariate=a.optuna_tpe == "multivariate")
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=a.eta)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    t0 = time.monotonic()
    finished_at = {}

    def objective(trial):
        lr = trial.suggest_float("lr", SPACE_LR[0], SPACE_LR[1], log=True)
        batch = trial.suggest_categorical("batch", SPACE_BATCH)
        opt = trial.suggest_categorical("optimizer", SPACE_OPTIMIZER)
        tdir = os.path.join(workdir, f"optuna-{seed}", f"trial-{trial.number:04d}")
        os.makedirs(tdir, exist_ok=True)
        metrics = os.path.join(tdir, "metrics.jsonl")
        cmd = [a.shoal, "run", "-n", "1", "-q", "--", a.program] + fixed_args(a) + [
            "--lr", repr(lr), "--batch", str(batch), "--optimizer", opt, "--metrics", metrics]
        with open(os.path.join(tdir, "log.txt"), "w") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=trial_env())
        seen = []
        rc = None
        while True:
            try:
                rc = p.wait(timeout=0.25)  # the same re-read period as shoal sweep's
            except subprocess.TimeoutExpired:
                rc = None
            if os.path.exists(metrics):
                with open(metrics) as f:
                    lines = [l for l in f.read().split("\n")[:-1] if l.strip()]
                for line in lines[len(seen):]:
                    value = json.loads(line)["test_accuracy"]
                    seen.append(value)
                    epoch = len(seen)
                    trial.report(value, epoch)
                    # No decision at the last epoch (shoal's max_epochs): that trial is complete.
                    if epoch < a.epochs and trial.should_prune():
                        os.killpg(p.pid, signal.SIGTERM)
                        try:
                            p.wait(timeout=2)
                        except subprocess.TimeoutExpired:
                            os.killpg(p.pid, signal.SIGKILL)
                            p.wait()
                        raise optuna.TrialPruned()
            if rc is not None:
                break
        if rc != 0 or not seen:
            raise RuntimeError(f"trial {trial.number} exited {rc}")
        finished_at[trial.number] = time.monotonic() - t0
        return seen[-1]

    study.optimize(objective, n_trials=a.trials, n_jobs=a.parallel, catch=(RuntimeError,))
    total = time.monotonic() - t0
    states = [t.state for t in study.trials]
    best = study.best_trial
    return {
        "tool": "optuna", "seed": seed, "best": best.value,
        "seconds_to_best": finished_at[best.number], "seconds": total,
        "completed": states.count(optuna.trial.TrialState.COMPLETE),
        "pruned": states.count(optuna.trial.TrialState.PRUNED),
        "failed": states.count(optuna.trial.TrialState.FAIL),
        "best_params": best.params,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shoal", default="build/shoal")
    p.add_argument("--program", default="build/fashion_mnist")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--startup", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--eta", type=int, default=3)
    p.add_argument("--train-subset", type=int, default=2048)
    p.add_argument("--shoal-tpe", choices=["multivariate", "univariate"], default="multivariate",
                   help="shoal's TPE variant (multivariate is shoal's default)")
    p.add_argument("--optuna-tpe", choices=["multivariate", "univariate"], default="univariate",
                   help="Optuna's TPE variant (univariate is Optuna's default)")
    p.add_argument("--surrogate", nargs="?", const=DEFAULT_TABLE, metavar="TABLE",
                   help="trials replay a table measured from the real program "
                        "(bench/sweep_surrogate.py) instead of training: many seeds in minutes")
    p.add_argument("--out", default="bench/results/sweep_vs_optuna")
    a = p.parse_args()
    a.shoal = os.path.abspath(a.shoal)
    a.program = os.path.abspath(a.program)
    if a.surrogate:
        a.program = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sweep_surrogate.py")
        os.environ["SWEEP_SURROGATE_TABLE"] = os.path.abspath(a.surrogate)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as workdir:
        for seed in [int(s) for s in a.seeds.split(",")]:
            # Alternate which tool goes first, so neither always gets the quieter machine.
            runs = [run_shoal, run_optuna] if seed % 2 else [run_optuna, run_shoal]
            for run in runs:
                r = run(a, seed, workdir)
                print(json.dumps(r), flush=True)
                rows.append(r)
    with open(a.out + ".jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    for tool in ["shoal", "optuna"]:
        mine = [r for r in rows if r["tool"] == tool]
        print(f"{tool}: median best {statistics.median(r['best'] for r in mine):.4f}, "
              f"mean best {statistics.mean(r['best'] for r in mine):.4f}, "
              f"median seconds to best {statistics.median(r['seconds_to_best'] for r in mine):.1f}, "
              f"median sweep seconds {statistics.median(r['seconds'] for r in mine):.1f}")
    # Per seed, shoal's best minus Optuna's: the paired comparison the target is about.
    by_seed = {}
    for r in rows:
        by_seed.setdefault(r["seed"], {})[r["tool"]] = r["best"]
    diffs = [d["shoal"] - d["optuna"] for d in by_seed.values() if len(d) == 2]
    if len(diffs) >= 2:
        se = statistics.stdev(diffs) / len(diffs) ** 0.5
        print(f"shoal - optuna per seed: mean {100 * statistics.mean(diffs):+.2f} points "
              f"(standard error {100 * se:.2f}), shoal better in {sum(d > 0 for d in diffs)}, "
              f"tied in {sum(d == 0 for d in diffs)}, worse in {sum(d < 0 for d in diffs)} "
              f"of {len(diffs)} seeds")


if __name__ == "__main__":
    main()
