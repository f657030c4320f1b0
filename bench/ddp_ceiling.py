#!/usr/bin/env python3
"""What two processes get out of this machine at all, beside what Shoal DDP gets.

For each model, ROUNDS interleaved rounds of: plain libtorch alone, two independent plain
processes at once (they never communicate; their samples/s are summed), and Shoal DDP with 2
ranks: the commands of bench/run_ddp.py, epoch 2 of 2 (150 steps). Prints the medians and the
ratios "two independent / alone" (the ceiling any data-parallel library faces here) and
"DDP 2 / two independent" (what DDP costs below that ceiling), as in bench/results/ddp.md.

    bench/ddp_ceiling.py [--build build] [--rounds 5] [--models small,fashion]
"""
import argparse
import json
import os
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(out):
    # plain_train prints JSON lines; under `shoal run` they carry a "[rank] " prefix.
    return [json.loads(l[l.index("{"):]) for l in out.splitlines() if "{" in l]


def last_epoch(rs, epochs):
    return sum(r["samples_per_second"] for r in rs if r["epoch"] == epochs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default="small,fashion")
    ap.add_argument("--steps", type=int, default=150)
    a = ap.parse_args()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    epochs = 2
    for model in a.models.split(","):
        plain = [os.path.join(a.build, "bench", "plain_train"), "--epochs", str(epochs),
                 "--steps", str(a.steps), "--model", model]
        ddp = [os.path.join(a.build, "shoal"), "run", "-q", "-n", "2", "--"] + plain + ["--ddp"]
        res = {"alone": [], "two independent": [], "Shoal DDP 2": []}
        for _ in range(a.rounds):
            p = subprocess.run(plain, capture_output=True, text=True, env=env, check=True)
            res["alone"].append(last_epoch(rows(p.stdout), epochs))
            procs = [subprocess.Popen(plain, stdout=subprocess.PIPE, text=True, env=env)
                     for _ in range(2)]
            outs = [q.communicate()[0] for q in procs]
            if any(q.returncode != 0 for q in procs):
                raise SystemExit(f"plain_train failed: {plain}")
            res["two independent"].append(last_epoch(rows(outs[0]) + rows(outs[1]), epochs))
            p = subprocess.run(ddp, capture_output=True, text=True, env=env, check=True)
            res["Shoal DDP 2"].append(
                last_epoch([r for r in rows(p.stdout) if r.get("ranks") == 2], epochs))
        med = {k: statistics.median(v) for k, v in res.items()}
        for k, v in res.items():
            print(f"{model} {k:16s} median {med[k]:8.0f} samples/s  runs {[round(x) for x in v]}")
        print(f"{model}: two independent / alone {med['two independent'] / med['alone']:.2f}x, "
              f"DDP 2 / alone {med['Shoal DDP 2'] / med['alone']:.2f}x, "
              f"DDP 2 / two independent {med['Shoal DDP 2'] / med['two independent']:.3f}")


if __name__ == "__main__":
    main()
