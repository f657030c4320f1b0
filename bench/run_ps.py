#!/usr/bin/env python3
"""Parameter-server benchmark, everything in the same run:
  (a) limits: memcpy of B bytes into a shared-memory mapping, one B-byte loopback TCP transfer
  (b) push+pull throughput (synchronous, SGD on the servers) with 1, 2, 4 servers and 1-8
      workers, B = 4 MiB (and 16/64 MiB for one worker)      build/bench/shoal_ps_bench
  (c) time to accuracy on Fashion-MNIST: all-reduce DDP vs PS sync vs PS async vs PS SSP (s=2),
      2 workers (+1 server), same model, batch per worker, optimizer and schedule
Writes bench/results/ps.md and ps.jsonl. Keep the machine otherwise idle while it runs.

usage: python3 bench/run_ps.py [--reps 3] [--epochs 3] [--train-reps 1]
--train-reps 0 skips (c) and keeps the training rows of the previous ps.jsonl (the report says
so); --only-push-pull S,W,MiB[,OPTIMIZER][;...] runs only those rows of (b) (the report says so)."""
import argparse, json, os, platform, statistics, subprocess, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
MiB = 1 << 20


def jsonl(out):
    rows = []
    for line in out.splitlines():
        line = line.split("] ", 1)[-1] if line.startswith("[") else line
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train-reps", type=int, default=1)
    p.add_argument("--only-push-pull", default="")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    a = p.parse_args()
    b = a.build
    rows = []

    def add(r):
        rows.append(r)
        print(json.dumps(r), flush=True)

    for rep in range(a.reps):
        for size in (4 * MiB, 16 * MiB, 64 * MiB):
            out = subprocess.run([f"{b}/bench/shoal_ps_bench", "limits", "--bytes", str(size)],
                                 env=ENV, check=True, capture_output=True, text=True).stdout
            for r in jsonl(out):
                add(dict(r, rep=rep))
        grid = [(1, 1, 4 * MiB, "sgd"), (1, 1, 16 * MiB, "sgd"), (1, 1, 64 * MiB, "sgd")]
        grid += [(s, w, 4 * MiB, "sgd") for s in (1, 2, 4) for w in (2, 4, 8)]
        # The servers' optimizer kernels (ps/update_kernels.h): Adam's and RMSprop's updates do
        # several times SGD's arithmetic per byte.
        grid += [(1, 1, 4 * MiB, "adam"), (1, 1, 4 * MiB, "rmsprop")]
        if a.only_push_pull:
            grid = [g.split(",") for g in a.only_push_pull.split(";")]
            grid = [(int(g[0]), int(g[1]), int(g[2]) * MiB, g[3] if len(g) > 3 else "sgd")
                    for g in grid]
        for s, w, size, optimizer in grid:
            out = subprocess.run([f"{b}/shoal", "run", "-q", "-n", str(w), "--servers", str(s), "--",
                                  f"{b}/bench/shoal_ps_bench", "--bytes", str(size), "--optimizer",
                                  optimizer],
                                 env=ENV, check=True, capture_output=True, text=True).stdout
            for r in jsonl(out):
                add(dict(r, rep=rep))

    modes = [("all-reduce DDP", "ddp", 0), ("PS sync", "ps-sync", 1), ("PS async", "ps-async", 1),
             ("PS SSP s=2", "ps-ssp", 1)]
    for rep in range(a.train_reps):
        for name, mode, servers in modes:
            with tempfile.NamedTemporaryFile(suffix=".jsonl") as m:
                cmd = [f"{b}/shoal", "run", "-q", "-n", "2"]
                if servers:
                    cmd += ["--servers", str(servers)]
                cmd += ["--", f"{b}/fashion_mnist", "--epochs", str(a.epochs), "-q", "--metrics",
                        m.name, "--mode", mode, "--staleness", "2"]
                t0 = time.time()
                subprocess.run(cmd, env=ENV, check=True, capture_output=True)
                wall = time.time() - t0
                for r in (json.loads(l) for l in open(m.name)):
                    add(dict(r, kind="train", variant=name, rep=rep, job_seconds=wall))

    a.kept_train = False
    if a.train_reps == 0 and os.path.exists(os.path.join(a.out, "ps.jsonl")):
        for line in open(os.path.join(a.out, "ps.jsonl")):
            r = json.loads(line)
            if r["kind"] == "train":
                rows.append(r)
                a.kept_train = True
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ps.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    write_report(rows, a, os.path.join(a.out, "ps.md"))


def med(rs, key):
    return statistics.median(r[key] for r in rs)


def write_report(rows, a, path):
    lim = {}
    for r in rows:
        if r["kind"] == "limits":
            lim.setdefault(r["bytes"], []).append(r)
    L = []
    L.append("# Parameter-server benchmark\n")
    L.append(f"Machine: {platform.node()}, {os.cpu_count()} cores. Medians of {a.reps} runs "
             "(push/pull) and of 20 timed steps within each run. Generated by `bench/run_ps.py`.\n")
    L.append("## Limits on this machine\n")
    L.append("| bytes | memcpy into shared memory (GB/s) | loopback TCP (GB/s) |")
    L.append("|---:|---:|---:|")
    for size in sorted(lim):
        L.append(f"| {size // MiB} MiB | {med(lim[size], 'shm_copy_GBps'):.2f} | "
                 f"{med(lim[size], 'tcp_GBps'):.2f} |")
    L.append("")
    L.append("## Push + pull, synchronous mode (servers apply SGD unless the row says)\n")
    L.append("GB/s counts both directions (a step moves the gradient in and the parameters out). "
             "`single` = one worker's step; `aggregate` = all workers' bytes over the wall time.\n")
    L.append("| servers | workers | bytes | optimizer | step (ms) | single GB/s | aggregate GB/s | single / shm copy |")
    L.append("|---:|---:|---:|---|---:|---:|---:|---:|")
    groups = {}
    for r in rows:
        if r["kind"] == "pushpull":
            key = (r["servers"], r["workers"], r["bytes"], r.get("optimizer", "sgd"))
            groups.setdefault(key, []).append(r)
    order = {"sgd": 0, "adam": 1, "rmsprop": 2}
    for (s, w, size, opt), rs in sorted(groups.items(), key=lambda kv: (
            kv[0][2], kv[0][0], kv[0][1], order.get(kv[0][3], 3))):
        copy = med(lim[size], "shm_copy_GBps") if size in lim else float("nan")
        L.append(f"| {s} | {w} | {size // MiB} MiB | {opt} | {med(rs, 'step_ms_median'):.2f} | "
                 f"{med(rs, 'single_GBps'):.2f} | {med(rs, 'aggregate_GBps'):.2f} | "
                 f"{med(rs, 'single_GBps') / copy:.0%} |")
    L.append("")
    L.append(f"## Time to accuracy on Fashion-MNIST ({a.epochs} epochs, 2 workers, batch 64 per "
             "worker, Adam lr 1e-3 with cosine decay)\n")
    if a.kept_train:
        L.append("Not rerun this time (`--train-reps 0`): the rows of the previous run, kept from "
                 "`ps.jsonl`.\n")
    L.append("| variant | test accuracy per epoch (%) | wall time at each epoch (s) | first epoch >= 90.5% at (s) | job wall (s) |")
    L.append("|---|---|---|---:|---:|")
    for name in ("all-reduce DDP", "PS sync", "PS async", "PS SSP s=2"):
        rs = [r for r in rows if r["kind"] == "train" and r["variant"] == name and r["rep"] == 0]
        if not rs:
            continue
        accs = " / ".join(f"{100 * r['test_accuracy']:.2f}" for r in rs)
        times = " / ".join(f"{r['elapsed_seconds']:.0f}" for r in rs)
        hit = next((r["elapsed_seconds"] for r in rs if r["test_accuracy"] >= 0.905), None)
        L.append(f"| {name} | {accs} | {times} | {'-' if hit is None else f'{hit:.0f}'} | "
                 f"{rs[0]['job_seconds']:.0f} |")
    L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
