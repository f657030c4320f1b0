#!/usr/bin/python3
"""Tensor-parallel benchmark, in one run (build/bench/tensor_parallel, bench/tensor_parallel.cpp),
one intra-op thread per process unless stated:
  (a) one transformer block (train/gpt.h's GptBlock, hidden 1024, 16 heads, feed-forward 4096,
      batch x sequence tokens), forward + backward: one process with 1 thread, one process with
      2 intra-op threads, Shoal TP = 2 (two processes x 1 thread); and a plain all-reduce of the
      block's all-reduce size between 2 processes (what the transport costs alone)
  (b) the example's model (examples/gpt_fortunes.cpp: 4 layers, hidden 128, 4 heads, context 64,
      batch 32, AdamW) trained end to end with HybridParallel on ByteCorpus batches: one process
      (1 and 2 threads), TP2, PP2 (1f1b, 4 micro-batches), DP2, and the 4-rank shapes
      TP2 x PP2, TP2 x DP2, PP2 x DP2 (and DP2 x PP2 x TP2 on 8 ranks); 4 and 8 ranks on 2 cores
      are oversubscribed
  (c) bf16 (libtorch's CPU autocast) against fp32: the block's three rows and the model's
      one-process, TP2 and DP2 rows
Configurations alternate within each repetition, so drifts of a shared machine hit all of them;
medians over repetitions. Writes bench/results/<name>.md and <name>.jsonl (name:
tensor_parallel).

usage: /usr/bin/python3 bench/run_tensor_parallel.py [--reps 5] [--parts block,model]
       [--precisions fp32,bf16] [--block-batch 4] [--block-sequence 128] [--block-steps 6]
       [--model-steps 20] [--max-ranks 8] [--env NAME=VALUE ...] [--build DIR] [--out DIR]
       [--name tensor_parallel] [--smoke]"""
import argparse, json, os, platform, re, shlex, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET_VS_ONE_THREAD, TARGET_VS_TWO_THREADS = 1.6, 0.9
MEGATRON_FORWARD, MEGATRON_BACKWARD = 2, 2  # all-reduces per block and iteration
# The example's model (examples/gpt_fortunes.cpp defaults).
MODEL = ["--vocabulary", "256", "--sequence", "64", "--hidden", "128", "--heads", "4", "--layers",
         "4", "--inner", "0", "--batch", "32", "--micro-batches", "4", "--schedule", "1f1b"]
# (label, ranks, data, pipeline, tensor, threads)
GRIDS = [("1 process, 1 thread", 1, 1, 1, 1, 1),
         ("1 process, 2 threads", 1, 1, 1, 1, 2),
         ("TP2", 2, 1, 1, 2, 1),
         ("PP2", 2, 1, 2, 1, 1),
         ("DP2", 2, 2, 1, 1, 1),
         ("TP2 x PP2", 4, 1, 2, 2, 1),
         ("TP2 x DP2", 4, 2, 1, 2, 1),
         ("PP2 x DP2", 4, 2, 2, 1, 1),
         ("DP2 x PP2 x TP2", 8, 2, 2, 2, 1)]
MODEL_BF16 = {"1 process, 1 thread", "TP2", "DP2"}
BLOCKS = [("1 process, 1 thread", 1, 1), ("1 process, 2 threads", 1, 2),
          ("Shoal TP2 (2 processes x 1 thread)", 2, 1)]
# Not a target row: two unrelated 1-thread processes, each the whole block, at the same time (no
# communication). Their summed tokens/s is what the 2 cores deliver to two 1-thread programs:
# the ceiling of any 2-process scheme here.
INDEPENDENT = "2 independent processes x 1 thread (no communication, sum)"


EXTRA_ENV = {}  # --env NAME=VALUE, for every run


def env_for(threads):
    t = str(threads)
    return dict(os.environ, **EXTRA_ENV, OMP_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t,
                MKL_NUM_THREADS=t)


def json_row(text):
    """The result line: a bare JSON object, or rank 0's behind "[0] " (`shoal run`)."""
    row = None
    for line in text.splitlines():
        m = re.match(r"^\[(\d+)\]\s?(.*)$", line)
        if m:
            if m.group(1) != "0":
                continue
            line = m.group(2)
        line = line.strip()
        if line.startswith("{"):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and "mode" in r:
                row = r
    return row


def run(cmd, threads, timeout):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env_for(threads), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    except OSError as e:
        return None, str(e)
    r = json_row(p.stdout)
    if p.returncode != 0 or r is None:
        tail = (p.stdout[-800:] + p.stderr[-1500:]).strip()
        return r, f"exit {p.returncode}: {tail}"
    r["wall_seconds"] = round(time.time() - t0, 2)
    return r, None


def run_concurrent(cmds, threads, timeout):
    """Starts every command at once; one row with their summed tokens/s."""
    t0 = time.time()
    procs = [subprocess.Popen(c, env=env_for(threads), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in cmds]
    rows, errs = [], []
    for c, p in zip(cmds, procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            errs.append(f"timed out after {timeout} s")
            continue
        r = json_row(out)
        if p.returncode != 0 or r is None:
            errs.append(f"exit {p.returncode}: {(out[-400:] + err[-800:]).strip()}")
        else:
            rows.append(r)
    if errs or not rows:
        return None, "; ".join(errs) or "no result"
    r = dict(rows[0])
    r["tokens_per_second"] = sum(x["tokens_per_second"] for x in rows)
    r["iter_ms"] = [x["iter_ms_median"] for x in rows]
    r["forward_ms"] = [x["forward_ms"][0] for x in rows]
    r["backward_ms"] = [x["backward_ms"][0] for x in rows]
    r["iter_ms_median"] = statistics.median(r["iter_ms"])
    r["processes"] = len(rows)
    r["wall_seconds"] = round(time.time() - t0, 2)
    return r, None


def launch(a, ranks, args):
    prog = os.path.join(a.build, "bench", "tensor_parallel")
    if ranks == 1:
        return [prog] + args
    return [os.path.join(a.build, "shoal"), "run", "-q", "-n", str(ranks), "--", prog] + args


def plan(a):
    """One repetition's configurations: (part, label, precision, threads, command)."""
    v = []
    precisions = a.precisions.split(",")
    parts = a.parts.split(",")
    tokens = a.block_batch * a.block_sequence
    if "block" in parts:
        for prec in precisions:
            # bf16 iterations are ~3x shorter: 3x as many keep each run's timed part as long.
            steps = a.block_steps * (3 if prec == "bf16" else 1)
            common = ["--mode", "block", "--batch", str(a.block_batch), "--sequence",
                      str(a.block_sequence), "--hidden", "1024", "--heads", "16", "--inner",
                      "4096", "--steps", str(steps), "--warmup", str(a.block_warmup)]
            for label, ranks, threads in BLOCKS:
                v.append(("block", label, prec, threads, ranks,
                          launch(a, ranks, common + ["--threads", str(threads), "--precision",
                                                     prec])))
            one = launch(a, 1, common + ["--threads", "1", "--precision", prec])
            v.append(("block", INDEPENDENT, prec, 1, 2, [one, one]))
            # The block's all-reduce payload: batch x sequence x hidden, in the dtype the
            # row-parallel layer's output has (bf16 under autocast).
            nbytes = tokens * 1024 * (2 if prec == "bf16" else 4)
            v.append(("allreduce", "plain all-reduce, 2 processes", prec, 1, 2,
                      launch(a, 2, ["--mode", "allreduce", "--bytes", str(nbytes), "--iters",
                                    str(a.allreduce_iters), "--precision", prec])))
    if "model" in parts:
        for prec in precisions:
            for label, ranks, d, p, t, threads in GRIDS:
                if prec == "bf16" and label not in MODEL_BF16:
                    continue
                if ranks > a.max_ranks:
                    continue
                args = ["--mode", "model"] + MODEL + [
                    "--data", str(d), "--pipeline", str(p), "--tensor", str(t), "--threads",
                    str(threads), "--steps", str(a.model_steps), "--warmup",
                    str(a.model_warmup), "--precision", prec]
                v.append(("model", label, prec, threads, ranks, launch(a, ranks, args)))
    return v


def machine():
    info = {"cpu": "", "cores": os.cpu_count(), "os": f"{platform.system()} {platform.release()}"}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        m = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
        info["cpu"] = m.group(1).strip() if m else ""
        m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
        flags = set(m.group(1).split()) if m else set()
        info["bf16_flags"] = sorted(f for f in flags if "bf16" in f or f.startswith("amx"))
        info["avx512f"] = "avx512f" in flags
    except OSError:
        pass
    try:
        info["lscpu_model"] = next(
            (l.split(":", 1)[1].strip() for l in subprocess.run(
                ["lscpu"], capture_output=True, text=True).stdout.splitlines()
             if l.startswith("Model name")), "")
    except OSError:
        info["lscpu_model"] = ""
    return info


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--parts", default="block,model")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--block-batch", type=int, default=4)
    p.add_argument("--block-sequence", type=int, default=128)
    p.add_argument("--block-steps", type=int, default=6, help="timed iterations (bf16: 3x)")
    p.add_argument("--block-warmup", type=int, default=3)
    p.add_argument("--allreduce-iters", type=int, default=50)
    p.add_argument("--model-steps", type=int, default=20)
    p.add_argument("--model-warmup", type=int, default=3)
    p.add_argument("--max-ranks", type=int, default=8, help="skip grids of more ranks")
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set in every run's environment (repeatable), e.g. "
                        "OPENBLAS_CORETYPE=SkylakeX")
    p.add_argument("--smoke", action="store_true", help="1 rep, 2 steps, 1 warm-up")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--name", default="tensor_parallel")
    a = p.parse_args()
    if a.smoke:
        a.reps, a.block_steps, a.block_warmup, a.model_steps, a.model_warmup = 1, 2, 1, 2, 1
        a.allreduce_iters = 5
    for kv in a.env:
        name, eq, value = kv.partition("=")
        if not eq or not name:
            p.error(f"--env: NAME=VALUE, got '{kv}'")
        EXTRA_ENV[name] = value
    os.makedirs(a.out, exist_ok=True)
    info = machine()
    info["load_before"] = os.getloadavg()
    info["command"] = ("/usr/bin/python3 bench/run_tensor_parallel.py " + " ".join(
        shlex.quote(x) for x in sys.argv[1:])).strip()
    rows, failures = [], []
    start = time.time()
    for rep in range(a.reps):
        for part, label, prec, threads, ranks, cmd in plan(a):
            if isinstance(cmd[0], list):
                r, err = run_concurrent(cmd, threads, a.timeout)
                cmd = cmd[0] + ["(x2 at once)"]
            else:
                r, err = run(cmd, threads, a.timeout)
            if err:
                failures.append({"rep": rep, "part": part, "label": label, "precision": prec,
                                 "command": " ".join(cmd), "error": err})
                print(f"FAILED {part} {label} {prec}: {err[:600]}", file=sys.stderr, flush=True)
                if r is None:
                    continue
            r.update({"part": part, "label": label, "rep": rep, "ranks": ranks})
            rows.append(r)
            print(json.dumps(r), flush=True)
    info["load_after"] = os.getloadavg()
    info["minutes"] = (time.time() - start) / 60
    with open(os.path.join(a.out, a.name + ".jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for fl in failures:
            f.write(json.dumps({"failed": True, **fl}) + "\n")
    write_report(rows, failures, info, a, os.path.join(a.out, a.name + ".md"))


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def per_rank(rs, field):
    """Per-rank medians over repetitions of a list field."""
    lists = [r[field] for r in rs if isinstance(r.get(field), list) and r[field]]
    if not lists:
        return None
    n = max(len(l) for l in lists)
    return [statistics.median(l[i] for l in lists if i < len(l)) for i in range(n)]


def fmt_list(xs, f="{:.1f}"):
    return ", ".join(f.format(x) for x in xs) if xs else "-"


def write_report(rows, failures, info, a, path):
    def select(part, label, prec):
        return [r for r in rows if r["part"] == part and r["label"] == label and
                r["precision"] == prec]

    def tps(rs):
        v = [r["tokens_per_second"] for r in rs]
        return (med(v), min(v), max(v)) if v else (None, None, None)

    precisions = a.precisions.split(",")
    la0, la1 = info["load_before"], info["load_after"]
    tokens = a.block_batch * a.block_sequence
    L = ["# Tensor-parallel benchmark", "",
         f"Machine: {info['lscpu_model'] or info['cpu'] or 'unknown CPU'}, {info['cores']} "
         f"cores, {info['os']}; bf16 in the CPU's flags: "
         f"{', '.join(info.get('bf16_flags') or []) or 'none'} (AVX-512: "
         f"{'yes' if info.get('avx512f') else 'no'}; no AMX unless listed). Load average (1/5/15 "
         f"min) before {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, after "
         f"{la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}; {info['minutes']:.1f} minutes. libtorch "
         f"1.13.1 (Debian), OpenBLAS (pthreads) for fp32 matrix products, oneDNN for bf16. "
         f"Environment added to every run: "
         f"{', '.join(f'{k}={v}' for k, v in EXTRA_ENV.items()) or 'none'} (besides "
         f"OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = the row's threads). Command: "
         f"`{info['command']}`. {a.reps} repetition(s), configurations alternating within each; "
         f"medians over repetitions (min - max beside tokens/s). Written by "
         f"`bench/run_tensor_parallel.py`; per-run rows in `{a.name}.jsonl`.", ""]

    # (a) The block.
    blocks = {}
    if "block" in a.parts.split(","):
        L += ["## (a) One transformer block", "",
              f"`GptBlock` (train/gpt.h): pre-norm causal self-attention, hidden 1024, 16 heads, "
              f"GELU feed-forward 4096 (12.6 M parameters), batch {a.block_batch} x sequence "
              f"{a.block_sequence} = {tokens} tokens. One iteration: forward + backward with a "
              f"fixed input (requiring its gradient, as a block inside a model) and output "
              f"gradient; {a.block_steps} timed iterations (bf16: {3 * a.block_steps}) after "
              f"{a.block_warmup} warm-up. "
              f"tokens/s = {tokens} x iterations / seconds. All-reduce ms: per rank, per "
              f"iteration, the wall time inside the tensor-parallel all-reduces "
              f"(`CommCounters::seconds`, read after forward and after backward: the rank's "
              f"timeline of forward, its all-reduces, backward, its all-reduces), waiting for "
              f"the peer included.", "",
              "| precision | configuration | tokens/s (median) | min - max | iteration ms | "
              "forward ms | backward ms | TP all-reduce ms/iter, forward + backward (per rank) "
              "| share of iteration | all-reduces per iter fwd/bwd | bytes per iter | vs 1 "
              "process 1 thread | vs 1 process 2 threads |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for prec in precisions:
            base1 = tps(select("block", BLOCKS[0][0], prec))[0]
            base2 = tps(select("block", BLOCKS[1][0], prec))[0]
            for label, ranks, threads in BLOCKS + [(INDEPENDENT, 2, 1)]:
                rs = select("block", label, prec)
                if not rs:
                    continue
                m, lo, hi = tps(rs)
                it = med([r["iter_ms_median"] for r in rs])
                fw = per_rank(rs, "forward_ms")
                bw = per_rank(rs, "backward_ms")
                arf = per_rank(rs, "allreduce_forward_ms") or []
                arb = per_rank(rs, "allreduce_backward_ms") or []
                ar = [x + y for x, y in zip(arf, arb)]
                nf = per_rank(rs, "allreduces_forward_per_iter")
                nb = per_rank(rs, "allreduces_backward_per_iter")
                by = per_rank(rs, "allreduce_bytes_per_iter")
                blocks[(prec, label)] = {"tps": m, "iter": it, "ar": ar, "arf": arf, "arb": arb,
                                         "fw": fw, "bw": bw, "nf": nf, "nb": nb, "bytes": by,
                                         "counts_ok": all(r.get("counts_match_megatron")
                                                          for r in rs)}
                tpar = ranks > 1 and label != INDEPENDENT
                share = fmt_list([x / it * 100 for x in ar], "{:.1f}%") if tpar else "-"
                arcol = ", ".join(f"{x:.1f} + {y:.1f}" for x, y in zip(arf, arb)) \
                    if tpar else "-"
                cnt = (f"{fmt_list(nf, '{:.0f}')} / {fmt_list(nb, '{:.0f}')}"
                       if tpar else "0 / 0")
                byc = f"{by[0] / 2**20:.1f} MiB" if by and tpar else "-"
                L.append(f"| {prec} | {label} | {m:.0f} | {lo:.0f} - {hi:.0f} | {it:.1f} | "
                         f"{fmt_list(fw)} | {fmt_list(bw)} | {arcol} | {share} | {cnt} | {byc} | "
                         f"{m / base1:.2f}x | {m / base2:.2f}x |" if base1 and base2 else
                         f"| {prec} | {label} | {m:.0f} | {lo:.0f} - {hi:.0f} | {it:.1f} | "
                         f"{fmt_list(fw)} | {fmt_list(bw)} | {arcol} | {share} | {cnt} | {byc} "
                         f"| - | - |")
        # Plain all-reduce against the in-block all-reduces.
        L += ["", "Plain all-reduce of the block's payload between the same 2 processes (native "
              "engine, shared memory within the host, back-to-back calls, no compute between), "
              "against the all-reduces inside the TP2 block:", "",
              "| precision | payload | plain all-reduce ms (median per call) | algbw GB/s | 4 "
              "x plain = ms per iteration | measured in the block, ms per iteration (per rank) "
              "| in the block beyond 4 x plain (waiting for the peer, cold caches) |",
              "|---|---|---|---|---|---|---|"]
        for prec in precisions:
            rs = select("allreduce", "plain all-reduce, 2 processes", prec)
            tp2 = blocks.get((prec, BLOCKS[2][0]))
            if not rs:
                continue
            ms = med([r["call_ms_median"] for r in rs])
            gb = med([r["algbw_gbps"] for r in rs])
            inblock = tp2["ar"] if tp2 else []
            L.append(f"| {prec} | {rs[0]['bytes'] / 2**20:.1f} MiB | {ms:.2f} | {gb:.1f} | "
                     f"{4 * ms:.1f} | {fmt_list(inblock)} | "
                     f"{fmt_list([x - 4 * ms for x in inblock])} |")
            blocks[(prec, "plain")] = ms
        L += ["", "Where the TP2 block's time goes (ms per iteration; TP2 compute: the "
              "iteration less the smaller of the ranks' all-reduce times, the rank that waited "
              "least):", "",
              "| precision | 1 process 1 thread | half of it (TP2's ideal) | one of 2 independent "
              "1-thread processes running at once | TP2 iteration | TP2 compute (iteration - "
              "all-reduces) | TP2 all-reduces | of which moving data (4 x plain) | ceiling for "
              "2 processes vs 1 thread (2 x lone / co-running) |", "|---|---|---|---|---|---|---|"
              "---|---|"]
        for prec in precisions:
            one, tp2 = blocks.get((prec, BLOCKS[0][0])), blocks.get((prec, BLOCKS[2][0]))
            ind, plain = blocks.get((prec, INDEPENDENT)), blocks.get((prec, "plain"))
            if not (one and tp2 and ind and plain is not None and tp2["ar"]):
                continue
            compute = tp2["iter"] - min(tp2["ar"])  # the rank that waited least computed most
            L.append(f"| {prec} | {one['iter']:.1f} | {one['iter'] / 2:.1f} | {ind['iter']:.1f} | "
                     f"{tp2['iter']:.1f} | {compute:.1f} | {fmt_list(tp2['ar'])} | "
                     f"{4 * plain:.1f} | {2 * one['iter'] / ind['iter']:.2f}x |")

    # (b) The model.
    models = {}
    if "model" in a.parts.split(","):
        cfg = next((r["config"] for r in rows if r["part"] == "model"), "?")
        L += ["", "## (b) The example's model end to end", "",
              f"`examples/gpt_fortunes.cpp`'s GPT ({cfg}), batch 32 x context 64 = 2048 tokens "
              f"per step, trained with `HybridParallel` on ByteCorpus batches (made before the "
              f"clock starts), AdamW lr 3e-3, weight decay 0.01; pipelines: 1f1b, 4 "
              f"micro-batches, planned by measured time. {a.model_steps} timed steps after "
              f"{a.model_warmup} warm-up, optimizer step included. **4 and 8 ranks on 2 cores "
              f"are oversubscribed** (2 and 4 processes per core): those rows measure the "
              f"overhead of the shape, not a speed-up. TP comm ms: per rank and step, the wall "
              f"time inside the tensor group's collectives (waiting included); data-parallel "
              f"and pipeline transfers are not in it.", "",
              "| precision | grid | ranks | tokens/s (median) | min - max | step ms | vs 1 "
              "process 1 thread | TP comm ms/step (per rank) | TP all-reduces per step fwd/bwd "
              "(rank 0) | final loss |", "|---|---|---|---|---|---|---|---|---|---|"]
        for prec in precisions:
            base = tps(select("model", GRIDS[0][0], prec))[0]
            for label, ranks, d, pp, t, threads in GRIDS:
                rs = select("model", label, prec)
                if not rs:
                    continue
                m, lo, hi = tps(rs)
                st = med([r["step_ms_median"] for r in rs])
                comm = per_rank(rs, "tp_comm_ms")
                nf = per_rank(rs, "tp_allreduces_forward_per_step")
                nb = per_rank(rs, "tp_allreduces_backward_per_step")
                loss = med([r["loss"] for r in rs])
                models[(prec, label)] = {"tps": m, "comm": comm, "step": st}
                L.append(f"| {prec} | {label} | {ranks} | {m:.0f} | {lo:.0f} - {hi:.0f} | "
                         f"{st:.1f} | {m / base:.2f}x | "
                         f"{fmt_list(comm) if t > 1 else '-'} | "
                         f"{f'{nf[0]:.0f} / {nb[0]:.0f}' if t > 1 and nf else '-'} | "
                         f"{loss:.4f} |" if base else
                         f"| {prec} | {label} | {ranks} | {m:.0f} | {lo:.0f} - {hi:.0f} | {st:.1f}"
                         f" | - | - | - | {loss:.4f} |")

    # (c) bf16 against fp32.
    if "bf16" in precisions and "fp32" in precisions:
        L += ["", "## (c) bf16 against fp32", "",
              "libtorch's CPU autocast in bf16 (`at::autocast::set_cpu_enabled`, dtype "
              "`kBFloat16`): linears and matrix products in bf16 (oneDNN), weights, layer norms, "
              "softmax and the optimizer in fp32; the block's backward outside autocast, the "
              "model's around `HybridParallel::step()` (its pipeline interleaves forward and "
              "backward).", "",
              "| part | configuration | fp32 tokens/s | bf16 tokens/s | bf16 / fp32 |",
              "|---|---|---|---|---|"]
        for part, labels, store in (("block", [b[0] for b in BLOCKS], blocks),
                                    ("model", [g[0] for g in GRIDS], models)):
            for label in labels:
                f32, b16 = store.get(("fp32", label)), store.get(("bf16", label))
                if f32 and b16:
                    L.append(f"| {part} | {label} | {f32['tps']:.0f} | {b16['tps']:.0f} | "
                             f"{b16['tps'] / f32['tps']:.2f}x |")

    # Targets.
    L += ["", "## Targets", ""]
    for prec in precisions:
        one, two, tp2 = (blocks.get((prec, b[0])) for b in BLOCKS)
        if one and two and tp2:
            r1, r2 = tp2["tps"] / one["tps"], tp2["tps"] / two["tps"]
            L.append(f"- {prec} block, TP2 >= {TARGET_VS_ONE_THREAD}x one process with 1 thread: "
                     f"{r1:.2f}x ({'met' if r1 >= TARGET_VS_ONE_THREAD else 'missed'}); >= "
                     f"{TARGET_VS_TWO_THREADS}x one process with 2 threads: {r2:.2f}x "
                     f"({'met' if r2 >= TARGET_VS_TWO_THREADS else 'missed'}).")
    tp2 = blocks.get(("fp32", BLOCKS[2][0])) or blocks.get(("bf16", BLOCKS[2][0]))
    if tp2:
        ok = all(blocks[k]["counts_ok"] for k in blocks if isinstance(blocks[k], dict)
                 and "counts_ok" in blocks[k])
        L.append(f"- Megatron's count, {MEGATRON_FORWARD} all-reduces per block forward and "
                 f"{MEGATRON_BACKWARD} backward: counted {fmt_list(tp2['nf'], '{:.0f}')} forward "
                 f"and {fmt_list(tp2['nb'], '{:.0f}')} backward per rank and iteration, no "
                 f"all-gathers ({'met' if ok else 'missed'}; the program exits 1 otherwise).")
    if failures:
        L += ["", "## Failed runs", ""]
        for fl in failures:
            L.append(f"- rep {fl['rep']}, {fl['part']} {fl['label']} {fl['precision']}: "
                     f"`{fl['command']}`: {fl['error'][:300].replace(chr(10), ' ')}")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
