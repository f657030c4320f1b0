#!/usr/bin/env python3
"""What an average costs against a sum: Shoal's all-reduce with ReduceOp::kSum and kAvg
(build/bench/shoal_allreduce_bench --op sum|avg), each algorithm, shared memory, n = 2 and 3,
float32 from 4 KiB to --max-bytes; with --before DIR also the same from another build (the code
before a change), every variant alternating within each repetition so that a shared machine's
drifts hit all of them. Every result is verified by the benchmark itself (an average exactly
against the sum times the float 1/n). Writes bench/results/allreduce_avg.md and .jsonl.

usage: python3 bench/run_allreduce_avg.py [--before DIR] [--reps 3] [--max-bytes 67108864]
       [--ranks 2,3] [--algorithms ring,rabenseifner,recursive_doubling,driver]"""
import argparse, json, os, platform, statistics, subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def binary(build):
    for p in (os.path.join(build, "bench", "shoal_allreduce_bench"),
              os.path.join(build, "shoal_allreduce_bench")):
        if os.path.exists(p):
            return p
    raise SystemExit(f"no shoal_allreduce_bench under {build}")


def run(exe, n, op, a):
    cmd = [exe, "-n", str(n), "--op", op, "--algorithms", a.algorithms, "--reps", "3",
           "--min-seconds", str(a.min_seconds), "--max-bytes", str(a.max_bytes)]
    p = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--before", help="build directory (or folder of binaries) before a change")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--ranks", default="2,3")
    p.add_argument("--algorithms", default="ring,rabenseifner,recursive_doubling,driver")
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--min-seconds", type=float, default=0.05)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the .md from the .jsonl of an earlier run")
    a = p.parse_args()
    ranks = [int(n) for n in a.ranks.split(",")]
    if a.report_only:
        with open(os.path.join(a.out, "allreduce_avg.jsonl")) as f:
            rows = [json.loads(l) for l in f if l.strip()]
        builds = [(b, None) for b in ("after", "before") if any(r["build"] == b for r in rows)]
        a.reps = 1 + max(r["rep"] for r in rows)
        report(rows, a, builds, ranks, os.path.join(a.out, "allreduce_avg.md"))
        return
    builds = [("after", binary(a.build))] + ([("before", binary(a.before))] if a.before else [])
    rows = []
    for rep in range(a.reps):
        for n in ranks:
            variants = [(b, exe, op) for b, exe in builds for op in ("sum", "avg")]
            if rep % 2:
                variants.reverse()
            for b, exe, op in variants:
                for r in run(exe, n, op, a):
                    r.update({"build": b, "op": op, "rep": rep})
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "allreduce_avg.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    report(rows, a, builds, ranks, os.path.join(a.out, "allreduce_avg.md"))


def report(rows, a, builds, ranks, path):
    def us(build, op, n, variant, size):
        v = [r["median_us"] for r in rows if r["build"] == build and r["op"] == op and
             r["n"] == n and r["variant"] == variant and r["bytes"] == size]
        return statistics.median(v) if v else None

    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                         capture_output=True, text=True).stdout.strip()
    L = ["# The average against the sum", "",
         f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
         f"shared with other work (indicative numbers). Shoal's all-reduce, float32, shared "
         f"memory, in place; per call the median over {a.reps} repetition(s) of each run's median "
         f"of 3 measurements (each >= {a.min_seconds} s of back-to-back calls). Variants "
         f"alternate within each repetition. Every result verified. Written by "
         f"`bench/run_allreduce_avg.py`.", "",
         "avg / sum: the time of an average over the time of a sum, same build, same size. "
         "Before, kAvg ran the sum and then a separate pass dividing the whole buffer; after, the "
         "division is part of the last reduction step (Note [Average in the last step] in "
         "`comm/native/algorithms.h`)."]
    names = [b for b, _ in builds]
    # Where the pass over memory shows: buffers of 1 MiB and more.
    L += ["", "## Summary: avg / sum from 1 MiB up (median over algorithms and sizes)", ""]
    for n in ranks:
        parts = []
        for b in names:
            q = [us(b, "avg", n, v, s) / us(b, "sum", n, v, s)
                 for v in sorted({r["variant"] for r in rows if r["n"] == n})
                 for s in sorted({r["bytes"] for r in rows if r["n"] == n})
                 if s >= (1 << 20) and us(b, "sum", n, v, s) and us(b, "avg", n, v, s)]
            if q:
                parts.append(f"{b} {statistics.median(q):.2f} (range {min(q):.2f} - {max(q):.2f})")
        L.append(f"- n = {n}: " + "; ".join(parts))
    for n in ranks:
        L += ["", f"## n = {n}", "",
              "| algorithm | bytes | " + " | ".join(f"{b} sum us | {b} avg us | {b} avg / sum"
                                                    for b in names) + " |",
              "|---|---|" + "---|---|---|" * len(names)]
        variants = sorted({r["variant"] for r in rows if r["n"] == n})
        for v in variants:
            sizes = sorted({r["bytes"] for r in rows if r["n"] == n and r["variant"] == v})
            for size in sizes:
                cells = []
                for b in names:
                    s, g = us(b, "sum", n, v, size), us(b, "avg", n, v, size)
                    cells.append(f"{s:.1f} | {g:.1f} | {g / s:.2f}" if s and g else "- | - | -")
                L.append(f"| {v} | {size} | " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
