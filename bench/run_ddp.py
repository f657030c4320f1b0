#!/usr/bin/env python3
"""Training benchmark: the Fashion-MNIST CNN, same data, batch per rank, optimizer and schedule,
one intra-op thread per process, in the same run:
  (a) plain libtorch, one process, no Shoal   (build/bench/plain_train)
  (b) Shoal DDP with 1, 2 and 4 ranks          (build/shoal run -n N -- build/fashion_mnist)
  (c) PyTorch DDP (gloo) with 1, 2 and 4 procs (bench/pytorch_ddp_train.py, /usr/bin/python3)
Writes bench/results/ddp.md and ddp.jsonl. Keep the machine otherwise idle while it runs.

usage: python3 bench/run_ddp.py [--epochs 3] [--reps 1]"""
import argparse, json, os, platform, statistics, subprocess, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None):
    e = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **(env or {}))
    out = subprocess.run(cmd, env=e, check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    a = p.parse_args()
    b = a.build
    variants = []  # (name, ranks, command builder)
    variants.append(("plain libtorch", 1, lambda: run([f"{b}/bench/plain_train", "--epochs", str(a.epochs)])))
    for n in (1, 2, 4):
        def shoal(n=n):
            with tempfile.NamedTemporaryFile(suffix=".jsonl") as m:
                subprocess.run([f"{b}/shoal", "run", "-q", "-n", str(n), "--", f"{b}/fashion_mnist",
                                "--epochs", str(a.epochs), "-q", "--metrics", m.name],
                               env=dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"),
                               check=True, capture_output=True)
                return [json.loads(l) for l in open(m.name)]
        variants.append((f"Shoal DDP", n, shoal))
    for n in (1, 2, 4):
        variants.append(("PyTorch DDP (gloo)", n, lambda n=n: run(
            ["/usr/bin/python3", os.path.join(ROOT, "bench", "pytorch_ddp_train.py"), "--procs",
             str(n), "--epochs", str(a.epochs)])))
    rows = []
    for rep in range(a.reps):
        for name, n, fn in variants:
            for r in fn():
                r.update({"variant": name, "ranks": n, "rep": rep})
                rows.append(r)
                print(json.dumps(r), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ddp.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    write_report(rows, a, os.path.join(a.out, "ddp.md"))


def write_report(rows, a, path):
    def summary(name, n):
        rs = [r for r in rows if r["variant"] == name and r["ranks"] == n]
        final = [r["test_accuracy"] for r in rs if r["epoch"] == a.epochs]
        return {"sps": statistics.median(r["samples_per_second"] for r in rs),
                "lo": min(r["samples_per_second"] for r in rs),
                "hi": max(r["samples_per_second"] for r in rs),
                "epoch_s": statistics.median(r["epoch_seconds"] for r in rs),
                "acc": statistics.median(final)}
    base = summary("plain libtorch", 1)
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                         capture_output=True, text=True).stdout.strip()
    L = ["# Data-parallel training benchmark", "",
         f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}. "
         f"Fashion-MNIST (60000 training images), the CNN of `train/fashion_cnn.h` (421k parameters), "
         f"batch 64 per rank, Adam lr 1e-3 with cosine decay, {a.epochs} epochs, one intra-op thread "
         f"per process, {a.reps} repetition(s); samples/s is the median over epochs and repetitions "
         f"(all ranks together), accuracy the median final test accuracy. Written by "
         f"`bench/run_ddp.py`.", "",
         "| variant | ranks | samples/s (median) | min - max | s/epoch | final test accuracy | vs plain libtorch |",
         "|---|---|---|---|---|---|---|"]
    order = [("plain libtorch", 1)] + [("Shoal DDP", n) for n in (1, 2, 4)] + \
            [("PyTorch DDP (gloo)", n) for n in (1, 2, 4)]
    res = {}
    for name, n in order:
        s = summary(name, n)
        res[(name, n)] = s
        L.append(f"| {name} | {n} | {s['sps']:.0f} | {s['lo']:.0f} - {s['hi']:.0f} | "
                 f"{s['epoch_s']:.1f} | {100 * s['acc']:.2f}% | "
                 f"{s['sps'] / base['sps']:.2f}x |")
    s1, s2 = res[("Shoal DDP", 1)], res[("Shoal DDP", 2)]
    p2 = res[("PyTorch DDP (gloo)", 2)]
    L += ["", "## Targets", "",
          f"- Shoal DDP, 1 rank, >= 97% of plain libtorch: {100 * s1['sps'] / base['sps']:.1f}% "
          f"({'met' if s1['sps'] >= 0.97 * base['sps'] else 'NOT met'}).",
          f"- Shoal DDP, 2 ranks, >= 1.8x plain libtorch: {s2['sps'] / base['sps']:.2f}x "
          f"({'met' if s2['sps'] >= 1.8 * base['sps'] else 'NOT met'}); PyTorch DDP with 2 "
          f"processes: {p2['sps'] / base['sps']:.2f}x; Shoal / PyTorch at 2: "
          f"{s2['sps'] / p2['sps']:.2f}x.",
          f"- Same accuracy (within 0.5 points of plain libtorch): Shoal 2 ranks "
          f"{100 * (s2['acc'] - base['acc']):+.2f} points "
          f"({'met' if abs(s2['acc'] - base['acc']) <= 0.005 else 'NOT met'}).",
          "", "## Notes", "",
          "- The machine is a VM on a shared host: one repetition of a variant can run 20% slower "
          "than another (see min - max). The targets are judged on the medians; the ratio of "
          "Shoal's 2-rank median to plain libtorch's best epoch is also given below.",
          f"- Shoal DDP 2 ranks against plain libtorch's fastest epoch ({base['hi']:.0f} "
          f"samples/s): {s2['sps'] / base['hi']:.2f}x; Shoal 1 rank: {s1['sps'] / base['hi']:.2f}x.",
          "- With 4 ranks on 2 cores every process shares a core, so 4 ranks cannot beat 2; the "
          "rows show what oversubscription costs.",
          "- The libtorch processes (plain and Shoal) keep freed memory for reuse "
          "(`train/allocator.h`: glibc's mmap threshold raised, trimming off); without it every "
          "step page-faults its activations afresh and a short run took 3x longer. The Python "
          "peer runs with PyTorch's defaults; its 1-process row "
          f"({res[('PyTorch DDP (gloo)', 1)]['sps'] / base['sps']:.2f}x of plain) shows it is "
          "not held back by that.",
          "- A few epochs per repetition keep the run short (about 10 minutes per repetition); "
          "the README's default run (8 epochs, "
          "2 ranks) reaches 92.3% test accuracy. Accuracy differences between rank counts come "
          "from the different data order per rank count and BatchNorm statistics over smaller "
          "per-rank batches, not from the gradient sum (tests/ddp_test.cpp checks that to 1e-5)."]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
