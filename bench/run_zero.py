#!/usr/bin/python3
"""ZeRO benchmark: Shoal's ZeroDataParallel (train/zero/zero.h) stages 1-3 against Shoal's DDP and
PyTorch's DDP and ZeroRedundancyOptimizer, in one invocation, on the same MLP (a Sequential of
--depth Linear(width, width) layers with ReLUs; 2048 x 6: 25.2 M parameters), the same random
batch per rank, Adam, one intra-op thread per process:
  (a) throughput and memory, for each rank count (--ranks 2,4):
        Shoal DDP, ZeRO-1, ZeRO-2, ZeRO-3   build/shoal run -n N -- build/bench/zero_train --variant V
        PyTorch DDP, ZeRO (gloo)             /usr/bin/python3 bench/pytorch_zero.py --procs N --variant V
      each --reps times, variants alternating within each repetition (drifts of a shared machine
      hit all of them); samples/s is the median over repetitions, memory is rank 0's bytes by
      category right after a backward (before the optimizer step) and the peak RSS.
  (b) the largest model: every process under the same memory budget (--fit-budget-mb, its own
      memory cgroup, or RLIMIT_AS: bench/mem_limit.py), the widest MLP of --fit-depth layers each
      of --fit-variants trains for a few steps at --fit-ranks ranks, found by bisection on the
      width. A run over the budget is killed by the kernel (cgroup) or fails to allocate
      (rlimit) and counts as "does not fit"; every run has a timeout (--timeout), and one that
      runs into it counts as "does not fit (timeout)".
Targets: ZeRO-1 and ZeRO-2 >= 0.95x Shoal DDP's samples/s, ZeRO-3 >= 0.80x; Shoal ZeRO-1 >= 1.3x
PyTorch's ZeroRedundancyOptimizer; the largest ZeRO-3 model >= 3x the largest DDP model.
Writes bench/results/<name>.md and <name>.jsonl (name: zero). Keep the machine otherwise idle.

usage: /usr/bin/python3 bench/run_zero.py [--quick] [--reps 3] [--steps 6] [--warmup 2]
       [--ranks 2,4] [--width 2048] [--depth 6] [--batch 32]
       [--variants ddp,zero1,zero2,zero3,torch-ddp,torch-zero]
       [--fit-variants ddp,zero3] [--fit-ranks 4] [--fit-budget-mb 1024] [--fit-depth 16]
       [--fit-batch 8] [--fit-steps 1] [--fit-tolerance 0.06] [--fit-mechanism cgroup|rlimit|auto]
       [--no-fit | --fit-only] [--timeout 300] [--name zero] [--out DIR]
--quick: 1 repetition, 3 timed steps after 1 warm-up, a 512 MiB budget and a 10% bracket: a
smoke test of the harness, not a measurement (about 6 minutes). The defaults take about 13-20
minutes on the 2-core machine (bench/results/zero.md, "Run time"). zero_train --trace-memory
shows where a variant's peak RSS is reached (rank 0, after every forward, backward and step)."""
import argparse, json, math, os, platform, shlex, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import mem_limit  # noqa: E402

NAMES = {"ddp": "Shoal DDP", "zero1": "Shoal ZeRO-1", "zero2": "Shoal ZeRO-2",
         "zero3": "Shoal ZeRO-3", "torch-ddp": "PyTorch DDP (gloo)",
         "torch-zero": "PyTorch ZeroRedundancyOptimizer (gloo)"}
TARGETS = {"zero1": 0.95, "zero2": 0.95, "zero3": 0.80}  # vs Shoal DDP
TARGET_VS_TORCH = 1.3  # Shoal ZeRO-1 vs PyTorch's ZeroRedundancyOptimizer
TARGET_FIT = 3.0  # largest ZeRO-3 model vs largest DDP model
OOM_EXIT = 3  # zero_train.cpp and pytorch_zero.py: a failed allocation
MiB = 1 << 20


def expected_bytes(variant, psi, n):
    """Bytes per rank the header's formulas give (fp32 Adam), for the memory table."""
    return {"ddp": 16 * psi, "torch-ddp": 16 * psi, "zero1": 8 * psi + 8 * psi / n,
            "torch-zero": 8 * psi + 8 * psi / n, "zero2": 4 * psi + 12 * psi / n,
            "zero3": 16 * psi / n}[variant]


def parse_result(text):
    for line in text.splitlines():
        if line.startswith("[0] "):
            line = line[4:]
        if line.startswith("RESULT "):
            row = {}
            for kv in line.split()[1:]:
                k, v = kv.split("=", 1)
                try:
                    row[k] = int(v)
                except ValueError:
                    try:
                        row[k] = float(v)
                    except ValueError:
                        row[k] = v
            return row
    return None


def command(a, variant, n, width, depth, batch, steps, warmup, wrap=()):
    common = ["--width", str(width), "--depth", str(depth), "--batch", str(batch),
              "--steps", str(steps), "--warmup", str(warmup)]
    if variant.startswith("torch-"):
        cmd = ["/usr/bin/python3", os.path.join(ROOT, "bench", "pytorch_zero.py"), "--procs",
               str(n), "--variant", variant[len("torch-"):]] + common
        return cmd + (["--wrap", shlex.join(wrap)] if wrap else [])
    return [a.shoal, "run", "-q", "-n", str(n), "--"] + list(wrap) + \
        [a.zero_train, "--variant", variant] + common


def run(cmd, timeout):
    """(row or None, why it failed or None, seconds, output tail). Never hangs: `timeout` sends
    TERM, then KILL 10 s later; shoal run and pytorch_zero.py take their ranks down with them."""
    t0 = time.time()
    p = subprocess.run(["timeout", "-k", "10", str(timeout)] + cmd, env=ENV,
                       capture_output=True, text=True)
    seconds = time.time() - t0
    out = p.stdout + p.stderr
    row = parse_result(p.stdout) if p.returncode == 0 else None
    if row is not None:
        return row, None, seconds, ""
    rc = p.returncode
    if rc == 124 or (rc == 137 and seconds >= timeout):
        why = f"timeout ({timeout} s)"
    elif rc == 137 or rc == -9 or "killed by signal 9" in out:
        why = "killed (SIGKILL: the OOM killer)"
    elif rc == OOM_EXIT or "out of memory" in out or "Cannot allocate memory" in out:
        why = "out of memory (allocation failed)"
    elif rc == 0:
        why = "no RESULT line"
    else:
        why = f"failed (exit {rc})"
    return None, why, seconds, out[-3000:]


def throughput(a, rows):
    variants = [v for v in a.variants.split(",") if v]
    ranks = [int(n) for n in a.ranks.split(",") if n]
    for rep in range(a.reps):
        for n in ranks:
            for v in variants:
                cmd = command(a, v, n, a.width, a.depth, a.batch, a.steps, a.warmup)
                row, why, seconds, tail = run(cmd, a.timeout)
                r = {"part": "throughput", "variant": v, "ranks": n, "rep": rep,
                     "wall_seconds": round(seconds, 2)}
                if row:
                    r.update(row)
                else:
                    r["failed"] = why
                    print(f"run_zero: {' '.join(cmd)}: {why}\n{tail}", file=sys.stderr)
                rows.append(r)
                print(json.dumps(r), flush=True)


def fit_mechanism(a):
    if a.fit_mechanism != "auto":
        return a.fit_mechanism
    try:
        name = f"shoal-mem-probe-{os.getpid()}"
        mem_limit.make_cgroup(name, "p0", 1 << 30)
        mem_limit.remove_cgroups(name)
        return "cgroup"
    except OSError as e:
        print(f"run_zero: no memory cgroup ({e}); RLIMIT_AS instead", file=sys.stderr)
        return "rlimit"


def largest(a, rows, mechanism):
    """Bisection on the width, per variant: the widest MLP that trains under the budget."""
    budget = a.fit_budget_mb * MiB
    n, depth = a.fit_ranks, a.fit_depth
    parent = f"shoal-zero-bench-{os.getpid()}"
    wrap = ["/usr/bin/python3", os.path.join(ROOT, "bench", "mem_limit.py"), "--bytes",
            str(budget), "--mechanism", mechanism, "--cgroup-parent", parent, "--"]
    g = a.fit_granularity
    results = {}
    for v in [v for v in a.fit_variants.split(",") if v]:
        probes = {}

        def fits(w):
            cmd = command(a, v, n, w, depth, a.fit_batch, a.fit_steps, 1, wrap)
            row, why, seconds, tail = run(cmd, a.timeout)
            mem_limit.remove_cgroups(parent)
            r = {"part": "fit", "variant": v, "ranks": n, "width": w, "depth": depth,
                 "params": depth * (w * w + w), "budget_mb": a.fit_budget_mb,
                 "mechanism": mechanism, "fits": row is not None, "wall_seconds": round(seconds, 2)}
            if row:
                r.update({k: row[k] for k in ("peak_rss", "peak_rss_max", "param_bytes",
                                              "grad_bytes", "optim_bytes", "rss_start",
                                              "peak_rss_built") if k in row})
            else:
                r["why"] = why
                if why.startswith("failed") or why == "no RESULT line":
                    print(f"run_zero: {' '.join(cmd)}: {why}\n{tail}", file=sys.stderr)
            rows.append(r)
            probes[w] = r
            print(json.dumps(r), flush=True)
            return row is not None

        # A first guess from the header's bytes per parameter (the unit gathered in stage 3
        # and its gradient, twice with prefetching), then grow or shrink by 1.25x until the
        # boundary is bracketed, then halve the bracket down to --fit-tolerance.
        bpp = expected_bytes(v, 1, n) + (12 / depth if v == "zero3" else 0)
        usable = max(budget - 120 * MiB, 32 * MiB) * 0.9
        w = max(g, int(math.sqrt(usable / bpp / depth)) // g * g)
        lo = hi = None
        while lo is None or hi is None:
            if fits(w):
                lo = w
                if hi is None:
                    w = int(w * 1.25) // g * g
            else:
                hi = w
                if lo is None:
                    w = int(w / 1.25) // g * g
                    if w < g:
                        break
            if lo is not None and hi is not None:
                break
        if lo is not None:
            while hi - lo > max(g, a.fit_tolerance * lo):
                mid = (lo + hi) // 2 // g * g
                if mid <= lo:
                    break
                if fits(mid):
                    lo = mid
                else:
                    hi = mid
        results[v] = {"largest": lo, "smallest_failing": hi, "probes": probes}
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: 1 rep, 3 steps, small budget")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=6, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=32, help="samples per rank")
    p.add_argument("--variants", default="ddp,zero1,zero2,zero3,torch-ddp,torch-zero")
    p.add_argument("--no-fit", action="store_true", help="skip the largest-model experiment")
    p.add_argument("--fit-only", action="store_true", help="only the largest-model experiment")
    p.add_argument("--fit-variants", default="ddp,zero3",
                   help="also possible: zero1, zero2, torch-ddp, torch-zero")
    p.add_argument("--fit-ranks", type=int, default=4)
    p.add_argument("--fit-budget-mb", type=int, default=1024, help="per process")
    p.add_argument("--fit-depth", type=int, default=16)
    p.add_argument("--fit-batch", type=int, default=8)
    p.add_argument("--fit-steps", type=int, default=1,
                   help="after 1 warm-up step (which creates Adam's state)")
    p.add_argument("--fit-granularity", type=int, default=64, help="widths are multiples")
    p.add_argument("--fit-tolerance", type=float, default=0.06,
                   help="stop when the bracket is within this fraction of the width")
    p.add_argument("--fit-mechanism", choices=["auto", "cgroup", "rlimit"], default="auto")
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--name", default="zero", help="output files <name>.md and <name>.jsonl")
    a = p.parse_args()
    if a.quick:
        a.reps, a.steps, a.warmup = 1, 3, 1
        if "--fit-budget-mb" not in " ".join(sys.argv):
            a.fit_budget_mb = 512
        if "--fit-tolerance" not in " ".join(sys.argv):
            a.fit_tolerance = 0.1
    a.shoal = os.path.join(a.build, "shoal")
    a.zero_train = os.path.join(a.build, "bench", "zero_train")
    for b in (a.shoal, a.zero_train):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"run_zero: {b} not built (cmake --build build --target shoal "
                             f"zero_train)")
    load0, t0 = os.getloadavg(), time.time()
    rows = []
    if not a.fit_only:
        throughput(a, rows)
    fit, mechanism = None, None
    if not a.no_fit:
        mechanism = fit_mechanism(a)
        fit = largest(a, rows, mechanism)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + ".jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    write_report(rows, fit, mechanism, a, load0, time.time() - t0,
                 os.path.join(a.out, a.name + ".md"))


def mib(b):
    return "-" if b is None else f"{b / MiB:.0f}"


def write_report(rows, fit, mechanism, a, load0, seconds, path):
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                         capture_output=True, text=True).stdout.strip()
    load1 = os.getloadavg()
    L = ["# ZeRO benchmark", "",
         f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}. "
         f"Load average (1/5/15 min) before {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, after "
         f"{load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f}; {seconds / 60:.1f} minutes. libtorch 1.13 "
         f"(Debian), one intra-op thread per process (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1). "
         f"Command: `/usr/bin/python3 bench/run_zero.py {' '.join(sys.argv[1:])}`. "
         f"Written by `bench/run_zero.py`; per-run rows in `{a.name}.jsonl`."]
    tp = [r for r in rows if r["part"] == "throughput"]
    if tp:
        psi = a.depth * (a.width * a.width + a.width)
        L += ["", "## Throughput and memory per rank", "",
              f"MLP: {a.depth} x Linear({a.width}, {a.width}) with ReLUs ({psi / 1e6:.1f} M "
              f"parameters), MSE on one random batch of {a.batch} per rank, Adam lr 1e-3; "
              f"{a.steps} timed steps after {a.warmup} warm-up, {a.reps} repetition(s), variants "
              f"alternating within each. samples/s = steps x batch x ranks / seconds (median over "
              f"repetitions, min - max beside it). Memory: rank 0, right after the last backward "
              f"(before the optimizer step): Shoal ZeRO from `MemoryReport`, Shoal DDP and "
              f"PyTorch from the tensors (each storage once; DDP's gradients are views into its "
              f"buckets, PyTorch's too with `gradient_as_bucket_view=True`). Expected: the "
              f"header's bytes per rank for fp32 Adam (16Ψ; ZeRO-1 8Ψ + 8Ψ/N; ZeRO-2 4Ψ + "
              f"12Ψ/N; ZeRO-3 16Ψ/N; PyTorch's ZeroRedundancyOptimizer shards the optimizer "
              f"state only, as ZeRO-1). Peak RSS: VmHWM of rank 0 / the largest over the ranks "
              f"(the process's libraries and, for PyTorch, the interpreter included). Loss: rank "
              f"0's at the last step; every variant starts from the same model and data, so the "
              f"Shoal rows must agree (PyTorch's draw the same numbers too).",
              "", "| variant | ranks | samples/s (median) | min - max | step ms | vs Shoal DDP "
              "| params MiB | grads MiB | optimizer MiB | total MiB | expected MiB | peak RSS MiB "
              "(rank 0 / max) | loss |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        summary = {}
        ranks = sorted({r["ranks"] for r in tp})
        variants = [v for v in NAMES if any(r["variant"] == v for r in tp)]
        for n in ranks:
            for v in variants:
                ok = [r for r in tp if r["variant"] == v and r["ranks"] == n and "failed" not in r]
                bad = [r for r in tp if r["variant"] == v and r["ranks"] == n and "failed" in r]
                if not ok:
                    L.append(f"| {NAMES[v]} | {n} | failed: {bad[0]['failed'] if bad else '-'} "
                             f"| | | | | | | | | | |")
                    continue
                sps = [r["samples_per_s"] for r in ok]
                last = ok[-1]
                summary[(v, n)] = statistics.median(sps)
                base = summary.get(("ddp", n))
                total = last["param_bytes"] + last["grad_bytes"] + last["optim_bytes"]
                note = f" ({len(bad)} failed)" if bad else ""
                L.append(
                    f"| {NAMES[v]} | {n} | {statistics.median(sps):.1f}{note} | {min(sps):.1f} - "
                    f"{max(sps):.1f} | {statistics.median(r['step_ms'] for r in ok):.0f} | "
                    f"{'-' if not base else f'{statistics.median(sps) / base:.2f}x'} | "
                    f"{mib(last['param_bytes'])} | {mib(last['grad_bytes'])} | "
                    f"{mib(last['optim_bytes'])} | {mib(total)} | "
                    f"{mib(expected_bytes(v, last['params'], n))} | {mib(last['peak_rss'])} / "
                    f"{mib(last['peak_rss_max'])} | {last['loss']:.6g} |")
        T = []
        for n in ranks:
            base = summary.get(("ddp", n))
            for v, t in TARGETS.items():
                if base and (v, n) in summary:
                    x = summary[(v, n)] / base
                    T.append(f"- {n} ranks: {NAMES[v]} >= {t:.2f}x Shoal DDP: {x:.2f}x "
                             f"({'met' if x >= t else 'NOT met'}).")
            z1, tz = summary.get(("zero1", n)), summary.get(("torch-zero", n))
            if z1 and tz:
                x = z1 / tz
                T.append(f"- {n} ranks: Shoal ZeRO-1 >= {TARGET_VS_TORCH}x PyTorch's "
                         f"ZeroRedundancyOptimizer: {x:.2f}x "
                         f"({'met' if x >= TARGET_VS_TORCH else 'NOT met'}); Shoal DDP / PyTorch "
                         f"DDP: {base / summary[('torch-ddp', n)]:.2f}x."
                         if base and ("torch-ddp", n) in summary else
                         f"- {n} ranks: Shoal ZeRO-1 >= {TARGET_VS_TORCH}x PyTorch's "
                         f"ZeroRedundancyOptimizer: {x:.2f}x "
                         f"({'met' if x >= TARGET_VS_TORCH else 'NOT met'}).")
        losses = {}
        for r in tp:
            if "loss" in r and not r["variant"].startswith("torch-"):
                losses.setdefault(r["ranks"], []).append(r["loss"])
        for n, ls in sorted(losses.items()):
            spread = (max(ls) - min(ls)) / max(abs(min(ls)), 1e-12)
            T.append(f"- {n} ranks: the Shoal variants' last losses agree within "
                     f"{spread:.1e} (relative)" + (" -- a variant computes something else!"
                                                    if spread > 1e-3 else "."))
        if T:
            L += ["", "### Targets", ""] + T
    if fit:
        L += ["", "## The largest model under a per-process memory budget", "",
              f"{a.fit_ranks} ranks, every process limited to {a.fit_budget_mb} MiB "
              f"({'its own memory cgroup, bench/mem_limit.py' if mechanism == 'cgroup' else 'RLIMIT_AS, bench/mem_limit.py'}); "
              f"MLP of {a.fit_depth} x Linear(w, w), batch {a.fit_batch} per rank, 1 warm-up and "
              f"{a.fit_steps} steps of Adam; bisection on w in multiples of {a.fit_granularity} "
              f"until the bracket is within {100 * a.fit_tolerance:.0f}%. Per-run timeout "
              f"{a.timeout} s.", "",
              "| variant | largest w that trains | parameters | params vs Shoal DDP | smallest w "
              "that does not | why it does not | peak RSS MiB at the largest (max over ranks) "
              "| rank 0 at the largest: RSS MiB before the model / peak once built / bytes "
              "accounted (params + grads + optimizer) | probes |",
              "|---|---|---|---|---|---|---|---|---|"]
        ddp_params = None
        if fit.get("ddp", {}).get("largest"):
            w = fit["ddp"]["largest"]
            ddp_params = a.fit_depth * (w * w + w)
        for v, res in fit.items():
            w, h = res["largest"], res["smallest_failing"]
            params = a.fit_depth * (w * w + w) if w else None
            why = res["probes"][h].get("why", "-") if h else "-"
            best = res["probes"][w] if w else {}
            rss = best.get("peak_rss_max")
            acc = sum(best.get(k, 0) for k in ("param_bytes", "grad_bytes", "optim_bytes"))
            phases = (f"{mib(best.get('rss_start'))} / {mib(best.get('peak_rss_built'))} / "
                      f"{mib(acc)}") if w else "-"
            L.append(f"| {NAMES[v]} | {w or 'none'} | "
                     f"{'-' if not params else f'{params / 1e6:.1f} M'} | "
                     f"{'-' if not (params and ddp_params) else f'{params / ddp_params:.2f}x'} | "
                     f"{h or '-'} | {why} | {mib(rss)} | {phases} | {len(res['probes'])} |")
        z3 = fit.get("zero3", {}).get("largest")
        if z3 and ddp_params:
            x = a.fit_depth * (z3 * z3 + z3) / ddp_params
            L += ["", f"Target: the largest ZeRO-3 model >= {TARGET_FIT}x the largest DDP model: "
                  f"{x:.2f}x ({'met' if x >= TARGET_FIT else 'NOT met'})."]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
