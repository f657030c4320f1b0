#!/usr/bin/python3
"""What elasticity costs the Trainer: examples/fashion_mnist (train::Trainer, strategy ddp) on a
fixed world against the same program in an elastic job (TrainerContext::elastic: an in-memory
commit of the model and Adam's state after every step, one broadcast per step asking whether
workers wait to join, the elastic sampler), and an elastic job that loses a worker against the
same job undisturbed. Each repetition runs the variants one after the other (a drift of the
shared machine hits them alike):
  fixed          shoal run -n 2 -- fashion_mnist ...
  elastic        shoal run --elastic 2:2 -n 2 -- fashion_mnist ...
  elastic, 3     shoal run --elastic 2:3 -n 3 -- fashion_mnist ...
  elastic, 3 -1  the same with --crash-at-step K --crash-rank 0: rank 0 SIGKILLs itself after
                 step K, the two others go on (the new rank 0 writes the metrics)
What is measured: the epochs' training throughput (samples / the epoch's step time, validation
excluded; the example's --metrics rows), the final test accuracy, and the job's wall time.
Every process gets OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1. Keep the machine otherwise idle.

--mode zero1|zero2 runs every variant under ZeRO instead of DDP (an elastic ZeRO step also sends
this rank's shard of the state to the next rank: train/zero/zero_elastic.h).

usage: /usr/bin/python3 bench/run_elastic_trainer.py [--reps 3] [--epochs 2] [--subset 19200]
       [--crash-step 60] [--mode ddp] [--build DIR] [--out DIR] [--name elastic_trainer]
Writes bench/results/<name>.md and <name>.jsonl (one row per epoch of each run: the example's
metrics row, where "ranks" is the workers that ended the epoch, plus variant, launched, rep, wall)."""
import argparse, json, os, platform, statistics, subprocess, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")


def run_job(build, launcher, args, timeout=600):
    """Runs one job; returns (its metrics rows, wall seconds). Fails loudly on a bad exit."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as m:
        cmd = [f"{build}/shoal", "run", "-q"] + launcher + ["--", f"{build}/fashion_mnist", "-q",
                                                             "--metrics", m.name] + args
        start = time.time()
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
        wall = time.time() - start
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stdout}{p.stderr}")
        rows = [json.loads(l) for l in open(m.name) if l.strip()]
    if not rows:
        raise SystemExit(f"{' '.join(cmd)} wrote no metrics")
    return rows, wall


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--subset", type=int, default=19200, help="training samples")
    p.add_argument("--crash-step", type=int, default=60)
    p.add_argument("--mode", default="ddp", choices=["ddp", "zero1", "zero2"])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--name", default="elastic_trainer")
    a = p.parse_args()
    common = ["--epochs", str(a.epochs), "--train-subset", str(a.subset), "--mode", a.mode]
    variants = [
        ("fixed", 2, ["-n", "2"], []),
        ("elastic", 2, ["--elastic", "2:2", "-n", "2"], []),
        ("elastic, 3", 3, ["--elastic", "2:3", "-n", "3"], []),
        ("elastic, 3 -1", 3, ["--elastic", "2:3", "-n", "3"],
         ["--crash-at-step", str(a.crash_step), "--crash-rank", "0"]),
    ]
    rows = []
    for rep in range(a.reps):
        for name, n, launcher, extra in variants:
            metrics, wall = run_job(a.build, launcher, common + extra)
            for r in metrics:
                r.update({"variant": name, "launched": n, "rep": rep, "wall": wall})
                rows.append(r)
                print(json.dumps(r), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + ".jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    write_report(rows, a, variants, os.path.join(a.out, a.name + ".md"))


def write_report(rows, a, variants, path):
    def of(name):
        return [r for r in rows if r["variant"] == name]

    def rate(name):
        return statistics.median(r["samples_per_second"] for r in of(name))

    def final_acc(name):
        last = {}
        for r in of(name):
            last[r["rep"]] = r["test_accuracy"]
        return statistics.median(last.values())

    def wall(name):
        return statistics.median({r["rep"]: r["wall"] for r in of(name)}.values())

    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    lines = [
        "# Elastic training on the Trainer: what it costs",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores. Shoal revision {rev}. "
        f"`examples/fashion_mnist --mode {a.mode}` (FashionCnn, 421k parameters, Adam, batch 64 "
        f"per rank), "
        f"{a.epochs} epochs of {a.subset} samples, one thread per process, {a.reps} repetitions "
        f"interleaved. Throughput: the median over epochs and repetitions of samples / the "
        f"epoch's step time (validation excluded). Written by `bench/run_elastic_trainer.py`.",
        "",
        "| variant | workers | samples/s (median) | min - max | vs fixed 2 | final test accuracy "
        "| job wall (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    base = rate("fixed")
    for name, n, _, _ in variants:
        rs = [r["samples_per_second"] for r in of(name)]
        lines.append(f"| {name} | {n} | {rate(name):.0f} | {min(rs):.0f} - {max(rs):.0f} | "
                     f"{rate(name) / base:.3f}x | {100 * final_acc(name):.2f}% | "
                     f"{wall(name):.1f} |")
    lines += [
        "",
        f"- Elastic against fixed, 2 workers: {rate('elastic') / base:.3f}x the throughput "
        f"(the per-step commit and the joiner check).",
        f"- Losing rank 0 at step {a.crash_step} of 3 workers: the job ends "
        f"{wall('elastic, 3 -1') - wall('elastic, 3'):+.1f} s from the undisturbed one, at "
        f"{100 * (final_acc('elastic, 3 -1') - final_acc('elastic, 3')):+.2f} points of its "
        f"accuracy (the rest of the run at 2 workers, with a larger share each).",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
