#!/usr/bin/python3
"""Pipeline-parallel training benchmark: the residual MLP of train/residual_mlp.h (12 blocks of
256, 1.79 M parameters), SGD lr 0.05 momentum 0.9, batch 256 of synthetic data, one intra-op
thread per process, in the same run:
  (a) plain libtorch, one process, no Shoal       build/bench/pipeline_train --schedule none
  (b) Shoal pipeline, 2 stages                     build/shoal run -n 2 -- build/bench/pipeline_train
      schedules gpipe, 1f1b (1 chunk per stage) and interleaved (2 chunks per stage), at 4, 8 and
      16 micro-batches; the m = 8 runs also write a Chrome trace, rendered as
      bench/results/pipeline_<schedule>.png by bench/trace_png.py
  (c) the PyTorch peers, bench/pytorch_pipeline.py (/usr/bin/python3): plain training, Pipe
      (GPipe, 2 CPU stages, one process) at 4, 8, 16 micro-batches, and the RPC pipeline at 8,
      in two layouts: driver + 2 stage workers (3 processes, as PyTorch's tutorial) and the
      driver hosting stage 0 (2 processes, one per core); "the better PyTorch pipeline" is the
      fastest of Pipe and RPC at m = 8
Variants alternate within each repetition, so drifts of a shared machine hit all of them.
Writes bench/results/<name>.md and <name>.jsonl (name: pipeline).

Contract with build/bench/pipeline_train (the C++ side):
  pipeline_train --schedule none|gpipe|1f1b|interleaved [--chunks C] [--micro-batches M]
                 --batch B --steps N --warmup W [--trace FILE.json]
  one process for --schedule none, under `shoal run -n 2` otherwise; OMP_NUM_THREADS=1 and
  OPENBLAS_NUM_THREADS=1 in its environment (it should also call torch::set_num_threads(1)).
  It prints ONE JSON line on stdout (rank 0 only; `shoal run` prefixes rank r's lines "[r] ";
  any other line is skipped) with at least:
    variant ("plain libtorch" | "shoal pipeline"), schedule, stages, chunks, micro_batches, batch,
    steps, samples_per_second (batch * steps / seconds of the timed steps), step_ms_median, loss,
  and for the pipeline also:
    bubble_measured (list, one idle fraction 0..1 per rank), bubble_formula (0..1),
    peak_activation_bytes (list per rank), peak_in_flight (list per rank: micro-batches whose
    activations were held at once).
  --trace writes Chrome trace JSON ({"traceEvents": [{"name", "ph": "X", "ts" (us), "dur",
  "pid" = rank, "tid", "cat", "args"}]}); forward/backward boxes are recognised by cat or name
  ("forward"/"backward", or names "F<mb>"/"B<mb>"), the micro-batch by args.mb, the model chunk
  by args.chunk, the training step by args.step (the PNG shows the last traced step when the
  events carry args.step, else the whole trace).

usage: /usr/bin/python3 bench/run_pipeline.py [--reps 3] [--steps 30] [--warmup 5]
       [--variants plain,shoal,pytorch] [--schedules gpipe,1f1b,interleaved]
       [--micro-batches 4,8,16] [--rpc-procs 3,2] [--build DIR] [--out DIR] [--name pipeline]
       [--smoke] [--keep-traces]
  --variants: plain (libtorch), shoal, pytorch (all three peers), or single peers: torch-plain,
  pipe, rpc. --smoke: 3 steps, 1 warm-up, 1 repetition, m = 8 only."""
import argparse, json, os, platform, re, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
PYTHON = "/usr/bin/python3"  # Debian's python3-torch
CHUNKS = {"gpipe": 1, "1f1b": 1, "interleaved": 2}
TRACE_M = 8
STAGES = 2
TARGET_PLAIN, TARGET_TORCH, TARGET_BUBBLE = 1.7, 1.5, 0.03
LABEL = {"plain": "plain libtorch", "torch-plain": "PyTorch plain", "pipe": "PyTorch Pipe",
         "rpc": "PyTorch RPC pipeline"}


def json_rows(text):
    """Result rows on stdout: bare JSON lines, or rank 0's behind "[0] " (other ranks and
    anything that is not a JSON object with samples_per_second are skipped)."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\[(\d+)\]\s?(.*)$", line)
        if m:
            if m.group(1) != "0":
                continue
            line = m.group(2)
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "samples_per_second" in r:
            rows.append(r)
    return rows


def run(cmd, timeout):
    """Runs one variant; returns (row or None, error text or None)."""
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return None, f"timed out after {timeout} s"
    except OSError as e:
        return None, str(e)
    rows = json_rows(p.stdout)
    if p.returncode != 0 or not rows:
        tail = (p.stdout[-800:] + p.stderr[-1500:]).strip()
        return None, f"exit {p.returncode}, {len(rows)} result line(s): {tail}"
    r = rows[-1]
    r["wall_seconds"] = round(time.time() - t0, 2)
    return r, None


def binary(build, name, sub="bench"):
    # The build tree's layout (build/shoal, build/bench/pipeline_train), or a flat folder.
    where = [os.path.join(build, sub, name), os.path.join(build, name)] if sub else \
        [os.path.join(build, name), os.path.join(build, "bench", name)]
    return next((p for p in where if os.path.exists(p)), where[0])  # missing: a failed run


def plan(a, tmp):
    """The variants of one repetition, in order: (key, meta, command, trace file or None)."""
    want = set(a.variants.split(","))
    if "pytorch" in want:
        want |= {"torch-plain", "pipe", "rpc"}
    ms = [int(m) for m in a.micro_batches.split(",") if m]
    common = ["--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup)]
    train = binary(a.build, "pipeline_train")
    peer = [PYTHON, os.path.join(HERE, "pytorch_pipeline.py")] + common
    v = []
    if "plain" in want:
        v.append(("plain", {"row": LABEL["plain"], "schedule": "none", "m": 1, "procs": 1},
                  [train, "--schedule", "none"] + common, None))
    if "shoal" in want:
        shoal = binary(a.build, "shoal", sub=None)
        for s in a.schedules.split(","):
            for m in ms:
                trace = os.path.join(tmp, f"trace_{s}_m{m}.json") if m == TRACE_M else None
                cmd = [shoal, "run", "-n", str(STAGES), "--", train, "--schedule", s, "--chunks",
                       str(CHUNKS[s]), "--micro-batches", str(m)] + common
                if trace:
                    cmd += ["--trace", trace]
                v.append((f"shoal-{s}", {"row": f"Shoal pipeline, {s}", "schedule": s, "m": m,
                                         "chunks": CHUNKS[s], "procs": STAGES}, cmd, trace))
    if "torch-plain" in want:
        v.append(("torch-plain", {"row": LABEL["torch-plain"], "schedule": "none", "m": 1,
                                  "procs": 1}, peer + ["--variant", "plain"], None))
    if "pipe" in want:
        for m in (ms if not a.smoke else [TRACE_M]):
            v.append(("pipe", {"row": LABEL["pipe"], "schedule": "gpipe", "m": m, "procs": 1},
                      peer + ["--variant", "pipe", "--micro-batches", str(m)], None))
    if "rpc" in want:
        for n in [int(x) for x in a.rpc_procs.split(",") if x]:
            v.append(("rpc", {"row": LABEL["rpc"] + f" ({n} procs)", "schedule": "gpipe",
                              "m": TRACE_M, "procs": n},
                      peer + ["--variant", "rpc", "--micro-batches", str(TRACE_M),
                              "--rpc-procs", str(n)], None))
    return v


def machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    torch = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, env=ENV).stdout.strip() or "?"
    return {"cpu": cpu, "cores": os.cpu_count(), "os": f"{platform.system()} {platform.release()}",
            "torch": torch}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"),
                   help="build tree (or flat folder) with shoal and bench/pipeline_train; "
                        "default: the repository's build/ (bench/../build)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--variants", default="plain,shoal,pytorch",
                   help="plain, shoal, pytorch (= torch-plain,pipe,rpc), torch-plain, pipe, rpc")
    p.add_argument("--schedules", default="gpipe,1f1b,interleaved")
    p.add_argument("--micro-batches", default="4,8,16")
    p.add_argument("--rpc-procs", default="3,2",
                   help="RPC pipeline layouts: 3 (driver + 2 workers) and/or 2 (driver = stage 0)")
    p.add_argument("--timeout", type=int, default=600, help="seconds per run")
    p.add_argument("--smoke", action="store_true", help="3 steps, 1 warm-up, 1 rep, m = 8")
    p.add_argument("--keep-traces", action="store_true",
                   help="also copy the trace JSONs to --out as pipeline_<schedule>.trace.json")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default="pipeline")
    a = p.parse_args()
    if a.smoke:
        a.steps, a.warmup, a.reps, a.micro_batches = 3, 1, 1, str(TRACE_M)
    known = {"plain", "shoal", "pytorch", "torch-plain", "pipe", "rpc"}
    bad = set(a.variants.split(",")) - known
    if bad:
        p.error(f"--variants: unknown {sorted(bad)} (known: {sorted(known)})")
    for s in a.schedules.split(","):
        if s not in CHUNKS:
            p.error(f"--schedules: unknown '{s}' ({', '.join(CHUNKS)})")
    os.makedirs(a.out, exist_ok=True)
    info = machine()
    info["load_before"] = os.getloadavg()
    rows, failures = [], []
    with tempfile.TemporaryDirectory(prefix="pipeline_bench_") as tmp:
        traces = {}
        for rep in range(a.reps):
            for key, meta, cmd, trace in plan(a, tmp):
                r, err = run(cmd, a.timeout)
                if err:
                    failures.append({"rep": rep, "key": key, **meta, "command": " ".join(cmd),
                                     "error": err})
                    print(f"FAILED {meta['row']} m={meta['m']}: {err[:400]}", file=sys.stderr,
                          flush=True)
                    continue
                r.update({"key": key, "rep": rep, **meta})
                if trace and os.path.exists(trace):
                    traces[meta["schedule"]] = trace  # the last repetition's wins
                rows.append(r)
                print(json.dumps(r), flush=True)
        info["load_after"] = os.getloadavg()
        pngs = render_traces(traces, a)
    with open(os.path.join(a.out, a.name + ".jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for fl in failures:
            f.write(json.dumps({"failed": True, **fl}) + "\n")
    write_report(rows, failures, pngs, info, a, os.path.join(a.out, a.name + ".md"))


def render_traces(traces, a):
    """schedule -> (png file name, error or None)."""
    out = {}
    sys.path.insert(0, HERE)
    try:
        import trace_png
    except ImportError as e:
        return {s: (None, f"trace_png: {e}") for s in traces}
    for s, trace in sorted(traces.items()):
        png = f"{a.name}_{s}.png"
        try:
            trace_png.render(trace, os.path.join(a.out, png),
                             title=f"Shoal pipeline, {s}, {STAGES} stages, m = {TRACE_M}",
                             step="last")
            out[s] = (png, None)
        except (Exception, SystemExit) as e:  # matplotlib missing, empty trace, ...
            out[s] = (None, f"{type(e).__name__}: {e}")
        if a.keep_traces:
            shutil.copy(trace, os.path.join(a.out, f"{a.name}_{s}.trace.json"))
    return out


def formula(schedule, m, chunks, stages=STAGES):
    # Idle fraction of each stage with equal stage times, no communication cost: (p - 1) idle
    # slots out of v*m + p - 1 (v model chunks per stage; the interleaved schedule divides the
    # warm-up and drain by v).
    return (stages - 1) / (chunks * m + stages - 1)


def write_report(rows, failures, pngs, info, a, path):
    def group(key, m):
        return [r for r in rows if r["key"] == key and r["m"] == m]

    def summary(rs):
        if not rs:
            return None
        sps = [r["samples_per_second"] for r in rs]
        ms_ = [r["step_ms_median"] for r in rs if r.get("step_ms_median") is not None]
        loss = [r["loss"] for r in rs if r.get("loss") is not None]
        return {"sps": statistics.median(sps), "lo": min(sps), "hi": max(sps), "n": len(rs),
                "ms": statistics.median(ms_) if ms_ else None,
                "loss": statistics.median(loss) if loss else None}

    def per_rank_median(rs, field):
        lists = [r[field] for r in rs if isinstance(r.get(field), list) and r[field]]
        if not lists:
            return None
        n = max(len(l) for l in lists)
        return [statistics.median(l[i] for l in lists if i < len(l)) for i in range(n)]

    groups = []  # (row label, key, m, summary, rows)
    seen = []
    for r in rows:
        k = (r["row"], r["key"], r["m"])
        if k not in seen:
            seen.append(k)
    for label, key, m in seen:
        rs = [r for r in rows if r["row"] == label and r["m"] == m]
        groups.append((label, key, m, summary(rs), rs))
    base = next((g[3] for g in groups if g[1] == "plain"), None)
    torch_pipes = [g for g in groups if g[1] in ("pipe", "rpc") and g[2] == TRACE_M]
    best_torch = max(torch_pipes, key=lambda g: g[3]["sps"]) if torch_pipes else None

    def ratio(s, b):
        return f"{s['sps'] / b['sps']:.2f}x" if s and b else "-"

    la0, la1 = info["load_before"], info.get("load_after", (float("nan"),) * 3)
    L = ["# Pipeline-parallel training benchmark", "",
         f"Machine: {info['cpu'] or 'unknown CPU'}, {info['cores']} cores, {info['os']}; "
         f"load average (1/5/15 min) before {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, after "
         f"{la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}; PyTorch {info['torch']} (Debian's "
         f"python3-torch, `/usr/bin/python3`). Model: the residual MLP of "
         f"`train/residual_mlp.h` (12 blocks of 256, 1.79 M parameters), cut in {STAGES} stages "
         f"after block 5; SGD lr 0.05 momentum 0.9, batch {a.batch} of synthetic data (fixed-seed "
         f"N(0,1) images, random labels, a few batches reused), {a.steps} timed steps after "
         f"{a.warmup} warm-up steps, one intra-op thread per process, {a.reps} repetition(s), "
         f"variants alternating within each. samples/s: batch x steps / seconds of the timed "
         f"steps, the median over repetitions (min - max beside it). Written by "
         f"`bench/run_pipeline.py`.", "",
         "## Throughput", "",
         "| variant | schedule | chunks/stage | micro-batches | processes | samples/s (median) "
         "| min - max | step ms (median) | final loss | vs plain libtorch | vs better PyTorch "
         "pipeline |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, key, m, s, rs in groups:
        chunks = rs[0].get("chunks", 1) if rs else 1
        loss = "-" if s["loss"] is None else f"{s['loss']:.4f}"
        ms_ = "-" if s["ms"] is None else f"{s['ms']:.1f}"
        L.append(f"| {label} | {rs[0]['schedule']} | {chunks} | {m} | {rs[0]['procs']} | "
                 f"{s['sps']:.0f} | {s['lo']:.0f} - {s['hi']:.0f} | {ms_} | {loss} | "
                 f"{ratio(s, base)} | {ratio(s, best_torch[3] if best_torch else None)} |")
    if best_torch:
        L += ["", f"The better PyTorch pipeline at m = {TRACE_M}: {best_torch[0]} "
                  f"({best_torch[3]['sps']:.0f} samples/s)."]
    if base is None:
        L += ["", "plain libtorch was not run (`--variants`): no ratios against it."]

    # Bubbles and memory (Shoal rows only).
    shoal = [g for g in groups if g[1].startswith("shoal-")]
    bubble_ok = []
    if shoal:
        L += ["", "## Bubble: measured idle fraction vs formula", "",
              "Formula: (p - 1) / (v m + p - 1) with p = 2 stages, v chunks per stage, m "
              "micro-batches (equal stage times, free communication); the binary's own "
              "`bubble_formula` in brackets when it differs. Measured: each rank's idle fraction "
              "of the timed steps, median over repetitions. Target: every rank within "
              f"{100 * TARGET_BUBBLE:.0f} points of the formula.", "",
              "| schedule | m | formula | measured per rank | worst deviation | within 3 points "
              "| compute ms/step per rank | slowest stage's idle |",
              "|---|---|---|---|---|---|---|---|"]
        for label, key, m, s, rs in shoal:
            sched, chunks = rs[0]["schedule"], rs[0].get("chunks", CHUNKS.get(rs[0]["schedule"], 1))
            f = formula(sched, m, chunks)
            theirs = [r["bubble_formula"] for r in rs if isinstance(r.get("bubble_formula"), (int, float))]
            fs = f"{100 * f:.1f}%"
            if theirs and abs(statistics.median(theirs) - f) > 1e-3:
                fs += f" [{100 * statistics.median(theirs):.1f}%]"
            meas = per_rank_median(rs, "bubble_measured")
            if meas is None:
                L.append(f"| {sched} | {m} | {fs} | (not reported) | - | - |")
                continue
            dev = max(abs(x - f) for x in meas)
            ok = dev <= TARGET_BUBBLE
            bubble_ok.append((sched, m, ok, dev))
            # The formula assumes equal stages; the slowest stage (most compute) is the one the
            # step waits for, so its idle fraction is the schedule's bubble on this cut.
            comp = per_rank_median(rs, "compute_ms")
            slow = (f"{100 * meas[comp.index(max(comp))]:.1f}% "
                    f"({100 * (meas[comp.index(max(comp))] - f):+.1f} points)") if comp else "-"
            L.append(f"| {sched} | {m} | {fs} | {', '.join(f'{100 * x:.1f}%' for x in meas)} | "
                     f"{100 * dev:.1f} points | {'met' if ok else 'missed'} | "
                     f"{', '.join(f'{x:.1f}' for x in comp) if comp else '-'} | {slow} |")
        L += ["", "## Peak activation memory per stage", "",
              "Median over repetitions of each rank's peak bytes of activations held for "
              "backward, and the most micro-batches in flight at once.", "",
              "| schedule | m | peak activations per rank (MiB) | peak in flight per rank |",
              "|---|---|---|---|"]
        for label, key, m, s, rs in shoal:
            act = per_rank_median(rs, "peak_activation_bytes")
            fl = per_rank_median(rs, "peak_in_flight")
            L.append(f"| {rs[0]['schedule']} | {m} | "
                     f"{', '.join(f'{x / 2**20:.2f}' for x in act) if act else '(not reported)'} "
                     f"| {', '.join(f'{x:g}' for x in fl) if fl else '(not reported)'} |")
    if pngs:
        L += ["", f"## Timelines (m = {TRACE_M}, the last traced step of the last repetition)", ""]
        for s, (png, err) in sorted(pngs.items()):
            L.append(f"- {s}: ![{s} timeline]({png})" if png else f"- {s}: no picture ({err})")

    # Targets.
    L += ["", "## Targets", ""]
    one = next((g for g in shoal if g[1] == "shoal-1f1b" and g[2] == TRACE_M), None)
    if one and base:
        r = one[3]["sps"] / base["sps"]
        L.append(f"- 1F1B, m = {TRACE_M} >= {TARGET_PLAIN}x plain libtorch: {r:.2f}x "
                 f"({'met' if r >= TARGET_PLAIN else 'missed'}).")
    else:
        L.append(f"- 1F1B, m = {TRACE_M} >= {TARGET_PLAIN}x plain libtorch: not measured "
                 f"(needs the shoal and plain rows).")
    if one and best_torch:
        r = one[3]["sps"] / best_torch[3]["sps"]
        L.append(f"- 1F1B, m = {TRACE_M} >= {TARGET_TORCH}x the better PyTorch pipeline "
                 f"({best_torch[0]}): {r:.2f}x ({'met' if r >= TARGET_TORCH else 'missed'}).")
    else:
        L.append(f"- 1F1B, m = {TRACE_M} >= {TARGET_TORCH}x the better PyTorch pipeline: not "
                 f"measured (needs the shoal and PyTorch pipeline rows).")
    if bubble_ok:
        missed = [f"{s} m={m} ({100 * d:.1f} points)" for s, m, ok, d in bubble_ok if not ok]
        L.append(f"- Bubbles within {100 * TARGET_BUBBLE:.0f} points of the formulas: "
                 + ("met for every schedule and m." if not missed else
                    "missed for " + ", ".join(missed) + "."))
    else:
        L.append(f"- Bubbles within {100 * TARGET_BUBBLE:.0f} points of the formulas: not "
                 f"measured.")
    if failures:
        L += ["", "## Failed runs", ""]
        for fl in failures:
            L.append(f"- rep {fl['rep']}, {fl['row']}, m = {fl['m']}: `{fl['command']}`: "
                     f"{fl['error'][:300].replace(chr(10), ' ')}")
    L += ["", "## Notes", "",
          "- PyTorch Pipe (`torch.distributed.pipeline.sync.Pipe`, 1.13) runs every CPU "
          "partition's forward on one worker thread (its threads are per device and both stages "
          "are 'cpu'), and the backward on autograd's single CPU thread: on a CPU its two stages "
          "never overlap, and it does not beat plain training on this machine; it is here as PyTorch's own API "
          "(GPipe schedule, `checkpoint='never'`).",
          "- The RPC pipeline follows the structure of PyTorch's 'Distributed Pipeline "
          "Parallelism Using RPC' tutorial: a driver process holds RRefs to the two stages in "
          "two worker processes, sends micro-batches with `remote`/`rpc_async`, and trains with "
          "distributed autograd and `DistributedOptimizer`. With 3 processes on 2 cores the "
          "driver (loss, concatenation, RPC bookkeeping) competes with the stages for the cores; "
          "the 2-process row puts stage 0 in the driver's process instead (`--rpc-procs`). Its "
          "forward pipelines micro-batches; its backward is distributed autograd's, not a 1F1B "
          "schedule.",
          "- Every process runs one intra-op thread. Besides it, Pipe has one worker thread, and "
          "each RPC process an agent pool of max(16, 4m + 8) threads (requests waiting on a "
          "stage's lock each hold one) plus TensorPipe's I/O threads; they mostly wait.",
          "- The machine is a VM shared with other work: compare rows of one run, and read the "
          "load averages above before trusting small differences."]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
