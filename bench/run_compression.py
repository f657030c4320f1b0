#!/usr/bin/python3
"""Gradient-compression benchmark: Shoal's DDP compression hooks (train/ddp/compression_hook.h)
against uncompressed Shoal DDP and PyTorch's DDP communication hooks, training to a target
accuracy on an emulated slow network, in one invocation.

Network: tests/netem/with_network.sh --hosts 2 --rate R (per --rates): two hosts, each a network
namespace on a bridge, every host's link shaped both ways by a tc token bucket at R; with
--delay D, D one way between the hosts (with_network.sh --delay: sch_netem, or the netfilter
queue of tests/netem/netem_queue.cpp), else none. 2 ranks per host, 4 in all; the 2 ranks of a host share its link.
Model and training (the same in both programs): Fashion-MNIST, MLP 784 - 3072 - 3072 - 10 with
ReLUs (11.9 M parameters), SGD with momentum 0.9 at a constant rate, 64 samples per rank and
step, DistributedSampler shards; the 10k test images evaluated every --eval-every steps, the
clock paused meanwhile.
  Shoal      build/shoal run --hosts H1:2,H2:2 --ssh netns-ssh -- build/bench/compression_train
             --compression SPEC (none, fp16, topk:0.01, powersgd:4, onebit, and top-k with
             momentum correction, topk:0.01,momentum=0.9, whose optimizer runs without momentum;
             the error-feedback codecs after --warmup uncompressed steps)
  PyTorch    bench/pytorch_compression.py, one process per rank started in its host's
             namespace (ip netns exec), gloo over the host's interface: no hook, its fp16 hook,
             its PowerSGD hook (rank 4, start_powerSGD_iter = --warmup)
Every run trains --max-steps steps (or stops at the first evaluation after --max-seconds of
training); "time to target" is the training time until the first evaluation at or above
--target-accuracy. Configurations alternate within each repetition (--reps), so drifts of the
shared machine hit all of them. Every process runs with one intra-op thread and the same malloc
settings (--malloc, see write_report).
Targets (at 100 Mbit/s): Shoal PowerSGD rank 4 and top-k 1% reach the target >= 3x sooner than
uncompressed Shoal DDP, final accuracy within 0.5 points of it; Shoal PowerSGD >= 1.5x sooner
than PyTorch DDP with its PowerSGD hook.
Writes bench/results/<name>.md and <name>.jsonl (name: compression). Needs root (network
namespaces) and an otherwise idle machine.

usage: /usr/bin/python3 bench/run_compression.py [--rates 100mbit[,1gbit]] [--reps 1]
       [--configs shoal-none,shoal-fp16,...] [--target-accuracy 0.77] [--max-steps 70]
       [--max-seconds 330] [--eval-every 5] [--warmup 2] [--lr 0.01] [--lr-for topk=0.005,...]
       (--lr-for and --momentum-for take codecs or configuration names: shoal-topk-mc=0.02)
       [--malloc reuse|default] [--quick] [--name compression] [--out DIR]
--quick: 12 steps of every configuration at 1gbit, a smoke test of the harness (about 5 minutes)."""
import argparse, json, os, platform, random, shlex, signal, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITH_NETWORK = os.path.join(ROOT, "tests", "netem", "with_network.sh")
PYTORCH = os.path.join(ROOT, "bench", "pytorch_compression.py")

# name -> (program, codec text before the warm-up option, display name)
CONFIGS = {
    "shoal-none": ("shoal", "none", "Shoal DDP, uncompressed"),
    "shoal-fp16": ("shoal", "fp16", "Shoal DDP, fp16"),
    "shoal-topk": ("shoal", "topk:0.01", "Shoal DDP, top-k 1%"),
    # DGC's momentum correction (comm/compress/momentum_correction.h): the momentum is the
    # codec's, before compression, and the optimizer's is 0 (momentum_of); the output layer
    # (30 K weights) and the biases are sent whole (dense=, see NOTES).
    "shoal-topk-mc": ("shoal", "topk:0.01,momentum=0.9,dense=65536",
                      "Shoal DDP, top-k 1%, momentum correction"),
    # The same without momentum correction (the optimizer's momentum): what dense= alone does.
    "shoal-topk-dense": ("shoal", "topk:0.01,dense=65536", "Shoal DDP, top-k 1%, dense output layer"),
    "shoal-powersgd": ("shoal", "powersgd:4", "Shoal DDP, PowerSGD rank 4"),
    # Shoal's PowerSGD needs no plain steps first (PyTorch's hook needs at least 2, its
    # start_powerSGD_iter): each system at its own least warm-up.
    "shoal-powersgd-w0": ("shoal", "powersgd:4,warmup=0",
                          "Shoal DDP, PowerSGD rank 4, no warm-up"),
    "shoal-onebit": ("shoal", "onebit", "Shoal DDP, 1-bit"),
    "torch-none": ("pytorch", "none", "PyTorch DDP, no hook"),
    "torch-fp16": ("pytorch", "fp16", "PyTorch DDP, fp16_compress_hook"),
    "torch-powersgd": ("pytorch", "powersgd:4", "PyTorch DDP, PowerSGD hook rank 4"),
}
DEFAULT_CONFIGS = ("shoal-none,shoal-fp16,shoal-topk,shoal-topk-mc,shoal-topk-dense,"
                   "shoal-powersgd,shoal-onebit,torch-fp16,torch-powersgd")
# The codecs that keep an error-feedback residual start after --warmup plain steps; a cast
# needs none (and PyTorch's fp16 hook has none).
WARMED = ("topk", "powersgd", "onebit")
TARGET_SOONER = 3.0  # PowerSGD and top-k vs uncompressed Shoal DDP
TARGET_POINTS = 0.5  # final accuracy within this many points of uncompressed
TARGET_VS_TORCH = 1.5  # Shoal PowerSGD vs PyTorch's PowerSGD hook
# glibc: no block from mmap, freed memory kept (see write_report, "Malloc").
MALLOC_REUSE = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"


def codec_of(name):
    return CONFIGS[name][1].split(":")[0]


def spec_of(name, a):
    text = CONFIGS[name][1]
    own = "warmup=" in text  # a configuration with its own warm-up keeps it
    return text + (f",warmup={a.warmup}" if codec_of(name) in WARMED and a.warmup and not own
                   else "")


def has_codec_momentum(name):
    return "momentum=" in CONFIGS[name][1]


def lr_of(name, a):
    # A configuration's own rate first, then its codec's (a codec with momentum correction is
    # another algorithm: the codec's rate does not carry over).
    if name in a.lr_for or has_codec_momentum(name):
        return a.lr_for.get(name, a.lr)
    return a.lr_for.get(codec_of(name), a.lr)


def momentum_of(name, a):
    # The codec applies the momentum: the optimizer's would apply it twice (compression_train
    # refuses that).
    if has_codec_momentum(name):
        return 0.0
    return a.momentum_for.get(name, a.momentum_for.get(codec_of(name), a.momentum))


def env_for(a):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.pop("GLIBC_TUNABLES", None)
    if a.malloc == "reuse":
        env["GLIBC_TUNABLES"] = MALLOC_REUSE
    return env


def eval_every_of(name, a):
    return a.eval_every_compressed if codec_of(name) in WARMED else a.eval_every


def train_args(name, a):
    return ["--compression", spec_of(name, a), "--target-accuracy", str(a.target_accuracy),
            "--eval-every", str(eval_every_of(name, a)), "--max-seconds", str(a.max_seconds),
            "--max-steps", str(a.max_steps), "--stop-at-target", "--min-steps", str(a.min_steps),
            "--lr", str(lr_of(name, a)), "--momentum", str(momentum_of(name, a)),
            "--seed", str(a.seed), "--batch", str(a.batch)]


def parse_row(text):
    for line in text.splitlines():
        if line.startswith("[0] "):
            line = line[4:]
        if line.startswith("{") and '"impl"' in line:
            return json.loads(line)
    return None


def run_shoal(name, a, hosts, timeout):
    build = os.path.abspath(a.build)
    cmd = [os.path.join(build, "shoal"), "run", "-q", "--hosts",
           ",".join(f"{h}:2" for h in hosts), "--ssh", os.environ["NETEM_SSH"],
           "--time-limit", str(timeout), "-x", "OPENBLAS_NUM_THREADS", "-x", "OMP_NUM_THREADS"]
    if a.malloc == "reuse":
        cmd += ["-x", "GLIBC_TUNABLES"]
    cmd += ["--", os.path.join(build, "bench", "compression_train")] + train_args(name, a)
    p = subprocess.run(["timeout", "-k", "10", str(timeout + 30)] + cmd, env=env_for(a),
                       capture_output=True, text=True)
    row = parse_row(p.stdout) if p.returncode == 0 else None
    return row, None if row else f"exit {p.returncode}", (p.stdout + p.stderr)[-3000:]


def interface_of(namespace, ip):
    out = subprocess.run(["ip", "-n", namespace, "-o", "-4", "addr", "show"], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) > 3 and f[3].split("/")[0] == ip:
            return f[1]
    raise SystemExit(f"run_compression: no interface with {ip} in {namespace}")


def run_pytorch(name, a, hosts, namespaces, timeout):
    """4 processes, 2 per host namespace, rendezvous at host 1; rank 0's JSON line."""
    port = str(random.randint(20000, 29999))
    procs, logs = [], []
    for rank in range(4):
        h = rank // 2
        env = env_for(a)
        env.update(RANK=str(rank), WORLD_SIZE="4", MASTER_ADDR=hosts[0], MASTER_PORT=port,
                   GLOO_SOCKET_IFNAME=interface_of(namespaces[h], hosts[h]))
        log = open(os.path.join(a.tmp, f"torch-rank{rank}.log"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", namespaces[h], "/usr/bin/python3", PYTORCH] +
            train_args(name, a), env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True))
    deadline, failed = time.time() + timeout, None
    while any(p.poll() is None for p in procs):
        bad = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
        if bad or time.time() > deadline:
            failed = f"rank {bad[0]} exit {procs[bad[0]].returncode}" if bad else \
                f"timeout ({timeout} s)"
            break
        time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if not failed:
        bad = [r for r, p in enumerate(procs) if p.returncode != 0]
        failed = f"rank {bad[0]} exit {procs[bad[0]].returncode}" if bad else None
    outs = []
    for log in logs:
        log.seek(0)
        outs.append(log.read())
        log.close()
    row = parse_row(outs[0]) if not failed else None
    return row, failed or (None if row else "no JSON line"), "".join(o[-1500:] for o in outs)


def inside(a):
    """Runs in with_network.sh's root namespace: every repetition and configuration at this
    network's rate; appends one JSON row per run to --rows."""
    hosts, namespaces = os.environ["NETEM_HOSTS"].split(), os.environ["NETEM_NAMESPACES"].split()
    rate = os.environ["NETEM_RATE"]
    os.makedirs(a.tmp, exist_ok=True)
    for rep in range(a.reps):
        for name in a.configs:
            timeout = int(a.max_seconds + 6 * a.max_steps / eval_every_of(name, a) + 240)
            t0 = time.time()
            if CONFIGS[name][0] == "shoal":
                row, why, tail = run_shoal(name, a, hosts, timeout)
            else:
                row, why, tail = run_pytorch(name, a, hosts, namespaces, timeout)
            r = {"config": name, "rate": rate, "rep": rep, "wall_seconds": round(time.time() - t0, 1)}
            record(a.rows, r, row, why, tail, "run_compression")


def record(rows, r, row, why, tail, who):
    """Completes the run's row `r` with its results (or why it failed), appends it to `rows` and
    prints a one-line summary."""
    if row:
        r.update(row)
    else:
        r["failed"] = why
        print(f"{who}: {r['config']} at {r['rate']}: {why}\n{tail}", file=sys.stderr)
    with open(rows, "a") as f:
        f.write(json.dumps(r) + "\n")
    brief = {k: r.get(k) for k in ("config", "rate", "rep", "steps", "median_step_seconds",
                                    "seconds_to_target", "final_accuracy", "wall_seconds",
                                    "failed") if k in r}
    print(json.dumps(brief), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="100mbit")
    p.add_argument("--delay", default="",
                   help="one-way delay between the hosts, e.g. 5ms (with_network.sh --delay)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--configs", default=DEFAULT_CONFIGS)
    p.add_argument("--target-accuracy", type=float, default=0.77)
    p.add_argument("--min-steps", type=int, default=70,
                   help="every run trains at least this many steps (accuracies compared there)")
    p.add_argument("--max-steps", type=int, default=250)
    p.add_argument("--max-seconds", type=float, default=330,
                   help="training seconds per run (checked at evaluations)")
    p.add_argument("--eval-every", type=int, default=5, help="none and fp16")
    p.add_argument("--eval-every-compressed", type=int, default=10,
                   help="top-k, PowerSGD, 1-bit (steps several times shorter)")
    p.add_argument("--warmup", type=int, default=2,
                   help="plain steps before top-k, PowerSGD and 1-bit (PyTorch's PowerSGD: >= 2)")
    p.add_argument("--lr", type=float, default=0.01)
    # Tuned on this model (bench/results/compression.md, "Hyperparameters"): with momentum 0.9
    # the error-feedback codecs oscillated (top-k fell from 0.719 to 0.646 between steps 40
    # and 60), so they run with less momentum and a larger rate.
    p.add_argument("--lr-for",
                   default="topk=0.03,onebit=0.06,shoal-topk-mc=0.02,shoal-topk-dense=0.02",
                   help="per codec or configuration, e.g. topk=0.005,shoal-topk-mc=0.02")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--momentum-for", default="topk=0.5,onebit=0,shoal-topk-dense=0.9",
                   help="per codec or configuration (not those with the codec's momentum)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--malloc", choices=["reuse", "default"], default="reuse")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--name", default="compression")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.configs = [c for c in a.configs.split(",") if c]
    for c in a.configs:
        if c not in CONFIGS:
            raise SystemExit(f"run_compression: unknown config '{c}' ({', '.join(CONFIGS)})")
    a.lr_for = {k: float(v) for k, v in (kv.split("=") for kv in a.lr_for.split(",") if kv)}
    a.momentum_for = {k: float(v) for k, v in
                      (kv.split("=") for kv in a.momentum_for.split(",") if kv)}
    if a.quick:
        a.rates, a.reps, a.min_steps, a.max_steps = "1gbit", 1, 12, 12
        a.eval_every = a.eval_every_compressed = 6
    if a.inside:
        inside(a)
        return
    for b in ("shoal", os.path.join("bench", "compression_train")):
        if not os.access(os.path.join(a.build, b), os.X_OK):
            raise SystemExit(f"run_compression: {a.build}/{b} not built (cmake --build build "
                             f"--target shoal compression_train)")
    a.tmp = f"/tmp/shoal-compression-{os.getpid()}"
    os.makedirs(a.tmp, exist_ok=True)
    rows_file = os.path.join(a.tmp, "rows.jsonl")
    load0, t0 = os.getloadavg(), time.time()
    passed = [x for x in sys.argv[1:]]
    for rate in a.rates.split(","):
        delay = ["--delay", a.delay] if a.delay else []
        cmd = [WITH_NETWORK, "--hosts", "2", "--rate", rate, *delay, "--", "/usr/bin/python3",
               os.path.abspath(__file__), "--inside", "--rows", rows_file, "--tmp", a.tmp,
               "--build", os.path.abspath(a.build)] + \
            [x for x in passed if x != "--quick"] + \
            (["--reps", "1", "--min-steps", "12", "--max-steps", "12", "--eval-every", "6",
              "--eval-every-compressed", "6"] if a.quick else [])
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            print(f"run_compression: {shlex.join(cmd)} exited {rc}", file=sys.stderr)
    rows = []
    if os.path.exists(rows_file):
        with open(rows_file) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + ".jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    write_report(rows, a, load0, time.time() - t0, os.path.join(a.out, a.name + ".md"))


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".1f", none="-"):
    return none if x is None else format(x, spec)


def mb(b):
    return "-" if b is None else f"{b / 1e6:.2f}"


def rate_bytes_per_second(rate):
    n = int(rate[:-4])
    return n * {"k": 1e3, "m": 1e6, "g": 1e9}[rate[-4]] / 8


def accuracy_at(row, step):
    for e in row.get("evals", []):
        if e[0] == step:
            return e[2]
    return None


def summarize(rows, name, rate, min_steps):
    ok = [r for r in rows if r["config"] == name and r["rate"] == rate and "failed" not in r]
    bad = [r for r in rows if r["config"] == name and r["rate"] == rate and "failed" in r]
    if not ok:
        return {"runs": 0, "failed": len(bad), "why": bad[0]["failed"] if bad else None}
    reached = [r for r in ok if r["seconds_to_target"] is not None]
    s = {"runs": len(ok), "failed": len(bad), "reached": len(reached)}
    for k in ("median_step_seconds", "bytes_per_step", "bytes_per_step_compressed",
              "link_bytes_per_step", "final_accuracy", "final_loss", "steps", "train_seconds"):
        s[k] = med(r.get(k) for r in ok)
    s["at_min"] = med(accuracy_at(r, min_steps) for r in ok)
    # Time to target: the median over the runs that reached it, if most did.
    most = len(reached) * 2 > len(ok)
    s["to_target"] = med(r["seconds_to_target"] for r in reached) if most else None
    s["steps_to_target"] = med(r["steps_to_target"] for r in reached) if most else None
    s["last"] = ok[-1]
    return s


def write_report(rows, a, load0, seconds, path):
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                         capture_output=True, text=True).stdout.strip()
    load1 = os.getloadavg()
    lrs = ", ".join(f"{k} {v}" for k, v in sorted(a.lr_for.items()))
    moms = ", ".join(f"{k} {v}" for k, v in sorted(a.momentum_for.items()))
    L = ["# Gradient compression on an emulated slow network", "",
         f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
         f"4 ranks on 2 emulated hosts (2 per host), all on these {os.cpu_count()} cores. Load "
         f"average (1/5/15 min) before {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, after "
         f"{load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f}; {seconds / 60:.1f} minutes. Command: "
         f"`/usr/bin/python3 bench/run_compression.py {' '.join(sys.argv[1:])}`. Written by "
         f"`bench/run_compression.py`; per-run rows (with every evaluation) in `{a.name}.jsonl`.",
         "",
         "Network: `tests/netem/with_network.sh --hosts 2 --rate R`: each host a network "
         "namespace with a veth pair to a bridge, shaped in both directions by a tc token bucket "
         "(tbf) at R (burst max(R/250 s, 64 KiB), queue 50 ms at R). "
         + (f"A one-way delay of {a.delay} between the hosts (`--delay`; round trip twice that), "
            "through sch_netem or, where the kernel lacks it, the netfilter queue of "
            "`tests/netem/netem_queue.cpp`. No loss. " if a.delay else
            "No delay or loss (`--delay` adds one): the links have the veth's microsecond "
            "latency and only bandwidth is emulated. ")
         + "The 2 ranks of a host share its link; between them Shoal uses "
         "shared memory and gloo the loopback, so a host's link carries only what crosses hosts. "
         "Shoal's all-reduce is the hierarchical one (`auto` on 2 hosts: reduce-scatter in the "
         "host, all-reduce across, all-gather in the host); gloo's is its ring over the 4 ranks.",
         "",
         f"Training: Fashion-MNIST, MLP 784-3072-3072-10 with ReLUs (11.9 M parameters, 47.5 MB "
         f"of float32 gradients per step), SGD momentum {a.momentum}, lr {a.lr} constant"
         f"{f' (per codec: lr {lrs}; momentum {moms})' if lrs else ' for every configuration'}, {a.batch} samples "
         f"per rank and step (global batch {4 * a.batch}), seed {a.seed}, the same initial model "
         f"on every rank. Each run trains until the first evaluation at or above the target "
         f"accuracy {a.target_accuracy}, but at least {a.min_steps} steps (where every run is "
         f"evaluated, so accuracies compare at equal steps) and at most {a.max_steps} steps or "
         f"the first evaluation after {a.max_seconds:.0f} s of training. The 10k test images "
         f"are evaluated every {a.eval_every} steps (uncompressed, fp16) or every "
         f"{a.eval_every_compressed} steps (top-k, PowerSGD, 1-bit: steps 4-8x shorter, so the "
         f"resolution in seconds stays finer than the uncompressed runs'), each rank a quarter "
         f"of them, the clock paused. Warm-up: {a.warmup} uncompressed steps before top-k, "
         f"PowerSGD and 1-bit in both programs (PyTorch's start_powerSGD_iter, which must be "
         f">= 2); the fp16 casts start at once (PyTorch's hook has no warm-up). One intra-op "
         f"thread per process; malloc: "
         + ("`GLIBC_TUNABLES=" + MALLOC_REUSE + "` for every process of every configuration "
            "(see \"Malloc\" below)." if a.malloc == "reuse" else "glibc's defaults.")]
    rates = []
    for r in rows:
        if r["rate"] not in rates:
            rates.append(r["rate"])
    summaries = {}
    for rate in rates:
        names = [n for n in CONFIGS if any(r["config"] == n and r["rate"] == rate for r in rows)]
        for n in names:
            summaries[(n, rate)] = summarize(rows, n, rate, a.min_steps)
        base = summaries.get(("shoal-none", rate), {})
        L += ["", f"## {rate}", "",
              "Medians over the runs (runs: how many; failed runs are counted apart). bytes/step: "
              "rank 0's own sends (DDP's `stats().bytesSent`, shared memory to its host peer "
              "included) over all steps, warm-up included / over the compressed steps only; "
              "gloo does not count PyTorch's. link MB/step: what host 1's interface sent (both "
              "its ranks, TCP/IP headers included) per step, warm-up included. link s/step: that "
              "over the rate, the least time a step's communication can take. step s: median "
              "wall time of rank 0's steps after the warm-up. Time to target: training seconds "
              "until the first evaluation at or above the target (steps in brackets); vs "
              "uncompressed: uncompressed Shoal DDP's time over this one. Accuracy at step "
              f"{a.min_steps}: equal steps for all; at the end: the last evaluation.", "",
              "| configuration | spec (lr, momentum) | runs | bytes/step MB (all / compressed) | link MB/step "
              f"| link s/step | step s | time to target s (steps) | vs uncompressed | accuracy "
              f"at step {a.min_steps} | accuracy at the end (step) | test loss at the end |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for n in names:
            s = summaries[(n, rate)]
            if s["runs"] == 0:
                L.append(f"| {CONFIGS[n][2]} | {spec_of(n, a)} | 0 ({s['failed']} failed: "
                         f"{s['why']}) | | | | | | | | | |")
                continue
            link_s = s["link_bytes_per_step"] / rate_bytes_per_second(rate) \
                if s["link_bytes_per_step"] is not None and rate != "none" else None
            s["link_s"] = link_s
            reached = s["to_target"] is not None
            ratio = base.get("to_target") / s["to_target"] \
                if base.get("to_target") and reached else None
            tt = (f"{s['to_target']:.1f} ({s['steps_to_target']:.0f})" if reached else
                  f"not reached in {s['steps']:.0f} steps ({s['reached']}/{s['runs']} runs)")
            bytes_col = ("-" if s["bytes_per_step"] is None else
                         f"{mb(s['bytes_per_step'])} / {mb(s['bytes_per_step_compressed'])}")
            failed = f" (+{s['failed']} failed)" if s["failed"] else ""
            L.append(f"| {CONFIGS[n][2]} | {s['last']['spec']} ({s['last']['lr']}, {s['last'].get('momentum', '-')}) | "
                     f"{s['runs']}{failed} | {bytes_col} | {mb(s['link_bytes_per_step'])} | "
                     f"{fmt(link_s, '.2f')} | {fmt(s['median_step_seconds'], '.2f')} | {tt} | "
                     f"{fmt(ratio, '.2f')}{'x' if ratio else ''} | {fmt(s['at_min'], '.4f')} | "
                     f"{fmt(s['final_accuracy'], '.4f')} ({s['steps']:.0f}) | "
                     f"{fmt(s['final_loss'], '.4f')} |")
        L += ["", "What limits each number (medians above; compute and codecs share the 2 cores "
              "with the other 3 ranks):", ""]
        for n in names:
            s = summaries[(n, rate)]
            if not s["runs"]:
                continue
            parts = []
            if s.get("link_s") is not None and s["median_step_seconds"]:
                share = s["link_s"] / s["median_step_seconds"]
                parts.append(f"step {s['median_step_seconds']:.2f} s, of which the link needs at "
                             f"least {s['link_s']:.2f} s ({100 * share:.0f}%; the rest is compute, "
                             f"the codec and waiting on the slowest rank)")
            if base.get("steps_to_target") and s["steps_to_target"]:
                parts.append(f"{s['steps_to_target']:.0f} steps to the target vs uncompressed's "
                             f"{base['steps_to_target']:.0f} "
                             f"({s['steps_to_target'] / base['steps_to_target']:.2f}x)")
            w = a.warmup if codec_of(n) in WARMED else 0
            if w and base.get("median_step_seconds") and s["to_target"]:
                parts.append(f"{w} uncompressed warm-up steps, about "
                             f"{w * base['median_step_seconds']:.1f} s of the "
                             f"{s['to_target']:.1f} s to the target")
            L.append(f"- {CONFIGS[n][2]}: " + "; ".join(parts) + ".")
        L += ["", "Accuracy at each evaluation (step: accuracy; the last run of each):", ""]
        for n in names:
            s = summaries[(n, rate)]
            if s["runs"]:
                L.append(f"- {CONFIGS[n][2]}: " + ", ".join(
                    f"{e[0]:.0f}: {e[2]:.3f}" for e in s["last"]["evals"]))
        T = targets(summaries, rate, a)
        if T:
            L += ["", f"### Targets at {rate}", ""] + T
    L += ["", "## Notes", "", NOTES.strip()]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


NOTES = """
Hyperparameters. One seed, the accuracy of the 10k test images every 10 steps, 150 steps, 4
ranks without shaping (the curve does not depend on the network). Momentum 0.9 with the
error-feedback codecs oscillated: top-k 1% at lr 0.01 went 0.719 (step 40), 0.686, 0.646
(step 60), 0.680, 0.697, 0.683, 0.654 (step 100) before 0.775 at step 140; at lr 0.005 it still
fell to 0.654 at step 100; 1-bit at lr 0.01 fell from 0.736 (step 40) to 0.624 (step 80). The
residual holds back gradient mass for many steps and momentum multiplies it when it is
released (what DGC's momentum correction addresses). With less momentum and a larger rate the
curves are smooth: top-k at lr 0.03, momentum 0.5: 0.770 at step 70, 0.806 at 150; at lr 0.06
without momentum 0.747 at 70, 0.809 at 150; 1-bit at lr 0.06 without momentum 0.771 at step 50,
0.803 at 120. Uncompressed and PowerSGD stay at lr 0.01 with momentum 0.9 (PowerSGD: 0.796 at
step 70, the uncompressed run's 0.797).

Momentum correction (shoal-topk-mc, `topk:0.01,momentum=0.9,dense=65536`, the optimizer without
momentum), tuned the same way (70 steps; 150 where said): the codec's momentum alone, with
DGC's masking, was smooth but slow (0.749 at step 70 at lr 0.01, 0.778 at 0.015) and oscillated
at 0.02 and 0.03 (0.718, 0.758). The output layer was the main cause: it shares a bucket with
only the biases, and 1% of its 30 K weights (about 340) a step could not train it. Sent whole
(dense=65536: the output layer and the biases, 3.3 MB a step instead of 2.9), step 70 reached
0.782 (lr 0.01), 0.803 (0.015) and 0.796 (0.02), lr 0.02 at or above the uncompressed curve at
every evaluation. dense= alone with the optimizer's momentum 0.9 (shoal-topk-dense) did as
well at step 70: 0.785 (lr 0.01), 0.787 (0.015), 0.800 (0.02). Over 150 steps at lr 0.02 the
momentum correction is the smoother: 0.811 to 0.823 at every evaluation from step 80 on,
against 0.790 to 0.825 with the optimizer's momentum. 1-bit with momentum correction
(`onebit,momentum=0.9`, lr 0.01): 0.779 at step 60, 0.756 at 70, no better than without.

Malloc. glibc serves blocks above its mmap threshold from fresh mmap'd pages and unmaps them on
free; Shoal's benchmarks raise the threshold (train/allocator.h), but glibc caps it at 32 MiB and
the 3072 x 3072 gradient is 37.7 MB, so every full-size temporary of that matrix (autograd's
weight gradient in every configuration; M = G + residual and M - P Q^T in Shoal's PowerSGD hook;
the error-feedback and decompression buffers of PyTorch's) is page-faulted in afresh every step.
`GLIBC_TUNABLES=glibc.malloc.mmap_max=0` serves them from the heap, which the trim threshold
keeps, for every process alike. Measured once on 4 local ranks without shaping (12 steps, median
step, a busy machine): Shoal uncompressed 0.45 -> 0.36 s, Shoal PowerSGD 1.07 -> 0.48 s, PyTorch
uncompressed 0.54 -> 0.58 s, PyTorch PowerSGD 2.12 -> 0.66 s. `--malloc default` runs without it.

PyTorch's PowerSGD over gloo runs with the whole model in one DDP bucket
(bench/pytorch_compression.py, Note [One bucket for PowerSGD over gloo]): its hook issues the
P and Q all-reduces from the callbacks of the first all-reduce, on gloo's threads, and with
several buckets the ranks issued them in different orders and gloo aborted (`op.preamble.length
<= op.nbytes`) at the first compressed step. PowerSGD's messages are small, so the lost overlap
costs little.
"""


def targets(summaries, rate, a):
    T = []
    base = summaries.get(("shoal-none", rate))
    if not base or not base.get("runs"):
        base = None  # a subset run without uncompressed: only the comparison with PyTorch
    for n in ("shoal-powersgd", "shoal-powersgd-w0", "shoal-topk", "shoal-topk-mc",
              "shoal-topk-dense"):
        s = summaries.get((n, rate))
        if not base or not s or not s["runs"]:
            continue
        if base["to_target"] and s["to_target"]:
            x = base["to_target"] / s["to_target"]
            T.append(f"- {CONFIGS[n][2]} reaches the target >= {TARGET_SOONER}x sooner than "
                     f"uncompressed Shoal DDP: {x:.2f}x ({base['to_target']:.1f} s / "
                     f"{s['to_target']:.1f} s) -- {'met' if x >= TARGET_SOONER else 'NOT met'}.")
        else:
            T.append(f"- {CONFIGS[n][2]} >= {TARGET_SOONER}x sooner: not measurable (target "
                     f"reached by uncompressed: {base['to_target'] is not None}, by this: "
                     f"{s['to_target'] is not None}) -- NOT met.")
        if s["at_min"] is not None and base["at_min"] is not None:
            d = 100 * (s["at_min"] - base["at_min"])
            T.append(f"- {CONFIGS[n][2]} accuracy within {TARGET_POINTS} points of uncompressed "
                     f"at equal steps ({a.min_steps}): {100 * s['at_min']:.2f} vs "
                     f"{100 * base['at_min']:.2f} ({d:+.2f} points) -- "
                     f"{'met' if d >= -TARGET_POINTS else 'NOT met'}; at the end of the runs: "
                     f"{100 * s['final_accuracy']:.2f} after {s['steps']:.0f} steps vs "
                     f"{100 * base['final_accuracy']:.2f} after {base['steps']:.0f}.")
    t = summaries.get(("torch-powersgd", rate))
    for n in ("shoal-powersgd", "shoal-powersgd-w0"):
        s = summaries.get((n, rate))
        if not (s and t and s["runs"] and t["runs"]):
            continue
        if s["to_target"] and t["to_target"]:
            x = t["to_target"] / s["to_target"]
            T.append(f"- {CONFIGS[n][2]} >= {TARGET_VS_TORCH}x sooner than PyTorch's PowerSGD "
                     f"hook: {x:.2f}x ({t['to_target']:.1f} s / {s['to_target']:.1f} s) -- "
                     f"{'met' if x >= TARGET_VS_TORCH else 'NOT met'}.")
        else:
            T.append(f"- {CONFIGS[n][2]} >= {TARGET_VS_TORCH}x sooner than PyTorch's PowerSGD: "
                     f"not measurable (a run did not reach the target) -- NOT met.")
    return T


if __name__ == "__main__":
    main()
