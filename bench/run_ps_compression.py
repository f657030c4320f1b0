#!/usr/bin/python3
"""Gradient compression with the parameter servers on an emulated slow network: uncompressed
pushes and pulls against fp16 pushes with fp16 pulls, top-k 1% and 1-bit pushes, in synchronous
mode, training to a target accuracy, with Shoal DDP (uncompressed and PowerSGD, as in
bench/run_compression.py) run in the same invocation as the reference.

Network: tests/netem/with_network.sh --hosts 2 --rate R (per --rates): two hosts, each a network
namespace on a bridge, every host's link shaped both ways by a tc token bucket at R; no delay
(this kernel has no sch_netem).
  PS    build/shoal run --hosts H1:2,H2:2,H1:1,H2:1 --servers 2 -- build/bench/ps_compression_train
        (2 workers and 1 server on each host: shoal run fills the hosts in list order and the last
        2 ranks are the servers, so server 0 is on host 1 and server 1 on host 2). The model is
        split over the 2 servers by bytes, so half of every push and pull crosses the link.
  DDP   bench/run_compression.py's Shoal runs (run_compression.run_shoal): 2 ranks per host,
        --configs ddp-none,ddp-powersgd.
Model, data, evaluation and stop rules: bench/run_compression.py's (Fashion-MNIST, MLP 784 -
3072 - 3072 - 10, 64 samples per worker and step, the test set every --eval-every steps with the
clock paused, stop at the first evaluation at or above --target-accuracy after --min-steps, or
at the first after --max-seconds). The PS servers apply SGD with the per-codec rate and momentum
of run_compression.py (ps::TrainingConfig), the DDP ranks libtorch's SGD with the same.
Configurations alternate within each repetition (--reps).
Writes bench/results/<name>.md and <name>.jsonl (name: ps_compression). Needs root (network
namespaces) and an otherwise idle machine.

usage: /usr/bin/python3 bench/run_ps_compression.py [--rates 100mbit] [--reps 1] [--max-seconds 330]
       [--max-seconds-for ps-none=720]
       [--configs ps-none,ps-fp16,ps-topk,ps-onebit,ddp-none,ddp-powersgd] [--quick] ...
--quick: 6 steps of every configuration at 1gbit, a smoke test of the harness."""
import argparse, json, os, platform, shlex, subprocess, sys, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import run_compression as rc  # noqa: E402  (the DDP runs, the network, the malloc settings)

WITH_NETWORK = rc.WITH_NETWORK

# name -> (program, push codec before the warm-up option, pull as fp16, display name); "ddp"
# names run_compression's configuration.
CONFIGS = {
    "ps-none": ("ps", "none", False, "PS, uncompressed"),
    "ps-fp16": ("ps", "fp16", True, "PS, fp16 push + fp16 pull"),
    "ps-topk": ("ps", "topk:0.01", False, "PS, top-k 1% push"),
    "ps-onebit": ("ps", "onebit", False, "PS, 1-bit push"),
    "ps-topk-half": ("ps", "topk:0.01", True, "PS, top-k 1% push + fp16 pull"),
    "ps-onebit-half": ("ps", "onebit", True, "PS, 1-bit push + fp16 pull"),
    "ddp-none": ("ddp", "shoal-none", None, "Shoal DDP, uncompressed"),
    "ddp-powersgd": ("ddp", "shoal-powersgd", None, "Shoal DDP, PowerSGD rank 4"),
}
DEFAULT_CONFIGS = "ps-none,ps-fp16,ps-topk,ps-onebit,ddp-none,ddp-powersgd"


def codec_of(name):
    prog, text = CONFIGS[name][0], CONFIGS[name][1]
    return rc.codec_of(text) if prog == "ddp" else text.split(":")[0]


def spec_of(name, a):
    if CONFIGS[name][0] == "ddp":
        return rc.spec_of(CONFIGS[name][1], a)
    text = CONFIGS[name][1]
    return text + (f",warmup={a.warmup}" if codec_of(name) in rc.WARMED and a.warmup else "")


def eval_every_of(name, a):
    # PS steps with raw pulls are not much shorter than fp16's (the pulls dominate): every
    # configuration is evaluated every --eval-every steps; the DDP references as in
    # run_compression.py.
    if CONFIGS[name][0] == "ddp":
        return rc.eval_every_of(CONFIGS[name][1], a)
    return a.eval_every


def max_seconds_of(name, a):
    return a.max_seconds_for.get(name, a.max_seconds)


def ps_args(name, a):
    args = ["--compression", spec_of(name, a), "--target-accuracy", str(a.target_accuracy),
            "--eval-every", str(eval_every_of(name, a)),
            "--max-seconds", str(max_seconds_of(name, a)),
            "--max-steps", str(a.max_steps), "--stop-at-target", "--min-steps", str(a.min_steps),
            "--lr", str(a.lr_for.get(codec_of(name), a.lr)),
            "--momentum", str(a.momentum_for.get(codec_of(name), a.momentum)),
            "--seed", str(a.seed), "--batch", str(a.batch)]
    return args + (["--pull-half"] if CONFIGS[name][2] else [])


def run_ps(name, a, hosts, timeout):
    build = os.path.abspath(a.build)
    # Workers fill the first 2 slots of each host, the servers (the last 2 ranks) one each.
    place = ",".join([f"{h}:2" for h in hosts] + [f"{h}:1" for h in hosts])
    cmd = [os.path.join(build, "shoal"), "run", "-q", "--hosts", place, "--servers",
           str(len(hosts)), "--ssh", os.environ["NETEM_SSH"], "--time-limit", str(timeout),
           "-x", "OPENBLAS_NUM_THREADS", "-x", "OMP_NUM_THREADS"]
    if a.malloc == "reuse":
        cmd += ["-x", "GLIBC_TUNABLES"]
    cmd += ["--", os.path.join(build, "bench", "ps_compression_train")] + ps_args(name, a)
    p = subprocess.run(["timeout", "-k", "10", str(timeout + 30)] + cmd, env=rc.env_for(a),
                       capture_output=True, text=True)
    row = rc.parse_row(p.stdout) if p.returncode == 0 else None
    if row:
        servers = []
        for line in p.stdout.splitlines():
            line = line.split("] ", 1)[-1] if line.startswith("[") else line
            if line.startswith("{") and '"server"' in line:
                servers.append(json.loads(line))
        row["server_reports"] = sorted(servers, key=lambda s: s["server"])
    return row, None if row else f"exit {p.returncode}", (p.stdout + p.stderr)[-3000:]


class Competitors(threading.Thread):
    """While a run goes on, the CPU time that processes outside the run used (another build, other
    tests): every few seconds, utime + stime of every process that is neither in one of the
    emulated hosts' namespaces nor a descendant of this one. A process first seen after the run
    started counts whole; one that starts and ends between two samples is missed."""

    def __init__(self, namespaces, every=5.0):
        super().__init__(daemon=True)
        self.every, self.stop = every, threading.Event()
        self.ours = set()
        for ns in namespaces:
            try:
                self.ours.add(f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]")
            except OSError:
                pass
        self.tick = os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            self.started = float(f.read().split()[0])
        self.seen, self.ticks, self.samples = {}, 0, 0

    def others(self):
        """pid -> (cpu ticks, start time in ticks since boot) of the processes outside the run."""
        stats, parent = {}, {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if os.readlink(f"/proc/{pid}/ns/net") in self.ours:
                    continue
            except OSError:
                continue
            # After the name: state, ppid (1), ..., utime (11), stime (12), ..., starttime (19).
            parent[int(pid)] = int(fields[1])
            stats[int(pid)] = (int(fields[11]) + int(fields[12]), int(fields[19]))
        me = os.getpid()
        out = {}
        for pid, v in stats.items():
            p, hops = pid, 0
            while p not in (0, 1, me) and hops < 64:
                p, hops = parent.get(p, 0), hops + 1
            if p != me:
                out[pid] = v
        return out

    def sample(self):
        for pid, (ticks, born) in self.others().items():
            if pid in self.seen:
                self.ticks += max(0, ticks - self.seen[pid])
            elif born / self.tick >= self.started:
                self.ticks += ticks
            self.seen[pid] = ticks
        self.samples += 1

    def run(self):
        self.sample()
        while not self.stop.wait(self.every):
            self.sample()

    def result(self, seconds):
        self.stop.set()
        self.join()
        self.sample()
        cpu = self.ticks / self.tick
        return {"cpu_seconds": round(cpu, 1), "cores": round(cpu / seconds, 2) if seconds else None,
                "samples": self.samples}


def inside(a):
    """Runs in with_network.sh's root namespace: every repetition and configuration at this
    network's rate; appends one JSON row per run to --rows."""
    hosts = os.environ["NETEM_HOSTS"].split()
    rate = os.environ["NETEM_RATE"]
    os.makedirs(a.tmp, exist_ok=True)
    for rep in range(a.reps):
        for name in a.configs:
            timeout = int(max_seconds_of(name, a) + 6 * a.max_steps / eval_every_of(name, a) + 240)
            t0, load0 = time.time(), os.getloadavg()[0]
            others = Competitors(os.environ["NETEM_NAMESPACES"].split())
            others.start()
            if CONFIGS[name][0] == "ps":
                row, why, tail = run_ps(name, a, hosts, timeout)
            else:
                row, why, tail = rc.run_shoal(CONFIGS[name][1], a, hosts, timeout)
            r = {"config": name, "rate": rate, "rep": rep, "wall_seconds": round(time.time() - t0, 1),
                 "load_before": load0, "load_after": os.getloadavg()[0],
                 "other_processes": others.result(time.time() - t0)}
            rc.record(a.rows, r, row, why, tail, "run_ps_compression")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="100mbit")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--configs", default=DEFAULT_CONFIGS)
    p.add_argument("--target-accuracy", type=float, default=0.77)
    p.add_argument("--min-steps", type=int, default=70,
                   help="every run trains at least this many steps (accuracies compared there)")
    p.add_argument("--max-steps", type=int, default=250)
    p.add_argument("--max-seconds", type=float, default=330,
                   help="training seconds per run (checked at evaluations)")
    # Uncompressed PS steps take about 10 s at 100 Mbit/s (twice DDP's): 330 s would stop it
    # near step 33, before the target (step 50 for the same update in DDP) and step 70.
    p.add_argument("--max-seconds-for", default="ps-none=720",
                   help="per PS configuration, e.g. ps-none=720 (the DDP runs: --max-seconds)")
    p.add_argument("--eval-every", type=int, default=5,
                   help="every PS configuration; DDP uncompressed")
    p.add_argument("--eval-every-compressed", type=int, default=10, help="DDP PowerSGD")
    p.add_argument("--warmup", type=int, default=2,
                   help="raw pushes (DDP: uncompressed steps) before top-k, PowerSGD and 1-bit")
    p.add_argument("--lr", type=float, default=0.01)
    # run_compression.py's tuned settings (bench/results/compression.md, "Hyperparameters").
    p.add_argument("--lr-for", default="topk=0.03,onebit=0.06")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--momentum-for", default="topk=0.5,onebit=0")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--malloc", choices=["reuse", "default"], default="reuse")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--name", default="ps_compression")
    p.add_argument("--report-from", help="write the report from this .jsonl (and the .run.json "
                   "beside it) without running anything")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.configs = [c for c in a.configs.split(",") if c]
    for c in a.configs:
        if c not in CONFIGS:
            raise SystemExit(f"run_ps_compression: unknown config '{c}' ({', '.join(CONFIGS)})")
    a.lr_for = {k: float(v) for k, v in (kv.split("=") for kv in a.lr_for.split(",") if kv)}
    a.momentum_for = {k: float(v) for k, v in
                      (kv.split("=") for kv in a.momentum_for.split(",") if kv)}
    a.max_seconds_for = {k: float(v) for k, v in
                         (kv.split("=") for kv in a.max_seconds_for.split(",") if kv)}
    for k in a.max_seconds_for:
        if k not in CONFIGS or CONFIGS[k][0] != "ps":
            raise SystemExit(f"run_ps_compression: --max-seconds-for: '{k}' is no PS config")
    if a.quick:
        a.rates, a.reps, a.min_steps, a.max_steps = "1gbit", 1, 6, 6
        a.eval_every = a.eval_every_compressed = 3
    if a.inside:
        inside(a)
        return
    if a.report_from:
        # The report again from a run's rows and its .run.json (the same options must be given).
        with open(a.report_from) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        with open(a.report_from[:-len(".jsonl")] + ".run.json") as f:
            run = json.load(f)
        write_report(rows, a, run, os.path.join(a.out, a.name + ".md"))
        return
    for b in ("shoal", os.path.join("bench", "ps_compression_train"),
              os.path.join("bench", "compression_train")):
        if not os.access(os.path.join(a.build, b), os.X_OK):
            raise SystemExit(f"run_ps_compression: {a.build}/{b} not built (cmake --build build "
                             f"--target shoal ps_compression_train compression_train)")
    a.tmp = f"/tmp/shoal-ps-compression-{os.getpid()}"
    os.makedirs(a.tmp, exist_ok=True)
    rows_file = os.path.join(a.tmp, "rows.jsonl")
    load0, t0 = os.getloadavg(), time.time()
    passed = [x for x in sys.argv[1:] if x != "--quick"]
    for rate in a.rates.split(","):
        cmd = [WITH_NETWORK, "--hosts", "2", "--rate", rate, "--", "/usr/bin/python3",
               os.path.abspath(__file__), "--inside", "--rows", rows_file, "--tmp", a.tmp,
               "--build", os.path.abspath(a.build)] + passed + \
            (["--reps", "1", "--min-steps", "6", "--max-steps", "6", "--eval-every", "3",
              "--eval-every-compressed", "3"] if a.quick else [])
        rc_ = subprocess.run(cmd).returncode
        if rc_ != 0:
            print(f"run_ps_compression: {shlex.join(cmd)} exited {rc_}", file=sys.stderr)
    rows = []
    if os.path.exists(rows_file):
        with open(rows_file) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + ".jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    run = {"load_before": list(load0), "load_after": list(os.getloadavg()),
           "seconds": time.time() - t0, "args": sys.argv[1:]}
    with open(os.path.join(a.out, a.name + ".run.json"), "w") as f:
        f.write(json.dumps(run) + "\n")
    write_report(rows, a, run, os.path.join(a.out, a.name + ".md"))


def summarize(rows, name, rate, min_steps):
    s = rc.summarize(rows, name, rate, min_steps)
    if s["runs"]:
        ok = [r for r in rows if r["config"] == name and r["rate"] == rate and "failed" not in r]
        for k in ("pushed_bytes_per_step", "pulled_bytes_per_step",
                  "pushed_bytes_per_step_compressed", "pulled_bytes_per_step_compressed"):
            s[k] = rc.med(r.get(k) for r in ok)
        # The furthest it trained without reaching the target: a lower bound on its time to it.
        s["not_reached_seconds"] = min((r["train_seconds"] for r in ok
                                        if r["seconds_to_target"] is None), default=None)
    return s


def bytes_cell(s, suffix=""):
    if s.get("pushed_bytes_per_step" + suffix) is not None:
        return (f"{rc.mb(s['pushed_bytes_per_step' + suffix])} + "
                f"{rc.mb(s['pulled_bytes_per_step' + suffix])}")
    v = s.get("bytes_per_step" + suffix)
    return "-" if v is None else f"{rc.mb(v)} sent"


def write_report(rows, a, run, path):
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                         capture_output=True, text=True).stdout.strip()
    load0, load1, seconds = run["load_before"], run["load_after"], run["seconds"]
    lrs = ", ".join(f"{k} {v}" for k, v in sorted(a.lr_for.items()))
    moms = ", ".join(f"{k} {v}" for k, v in sorted(a.momentum_for.items()))
    L = ["# Gradient compression with the parameter servers on an emulated slow network", "",
         f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
         f"2 emulated hosts, all their processes on these {os.cpu_count()} cores. Load average "
         f"(1/5/15 min) before {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, after "
         f"{load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f}; {seconds / 60:.1f} minutes. Command: "
         f"`/usr/bin/python3 bench/run_ps_compression.py {' '.join(run['args'])}`. Written by "
         f"`bench/run_ps_compression.py`; per-run rows (with every evaluation and the servers' "
         f"reports) in `{a.name}.jsonl`.",
         "",
         "Network: `tests/netem/with_network.sh --hosts 2 --rate R`, as in `compression.md`: each "
         "host a network namespace with a veth pair to a bridge, shaped in both directions by a "
         "tc token bucket (tbf) at R; no delay or loss (no sch_netem on this kernel), so only "
         "bandwidth is emulated. A host's link carries only what crosses hosts (ranks of one "
         "host use shared memory).",
         "",
         "Placement. PS: 2 workers and 1 parameter server on each host (`shoal run --hosts "
         "H1:2,H2:2,H1:1,H2:1 --servers 2`: the hosts are filled in list order and the last 2 "
         "ranks are the servers, so server 0 is on host 1 and server 1 on host 2). The model is "
         "split over the 2 servers by bytes (ps/partition.h; the 3072 x 3072 weight is cut "
         "between them), so half of every worker's push and pull crosses the link and half "
         "stays on its host. A host's link then sends its 2 workers' pushes to the remote "
         "server and its server's replies to the 2 remote workers: about one worker's push + "
         "pull payload per step, each way. Synchronous mode: a server applies a step once every "
         "worker's push for it arrived (averaged), and answers the pulls for the next step "
         "after that; pushes and pulls do not overlap. DDP: 2 ranks per host, the hierarchical "
         "all-reduce (run_compression.py's runs).",
         "",
         f"Training: Fashion-MNIST, MLP 784-3072-3072-10 with ReLUs (11.9 M parameters, 47.5 MB "
         f"of float32 per push or pull), 4 workers (ranks) x {a.batch} samples per step (global "
         f"batch {4 * a.batch}), seed {a.seed}, the same initial model everywhere. SGD with "
         f"momentum {a.momentum}, lr {a.lr} constant (per codec: lr {lrs}; momentum {moms}; "
         f"run_compression.py's settings), applied by the servers to the average of the workers' "
         f"gradients (PS) or by every rank to the all-reduced average (DDP): the same update. "
         f"Each run trains until the first evaluation at or above the target accuracy "
         f"{a.target_accuracy}, but at least {a.min_steps} steps (evaluated there, so "
         f"accuracies compare at equal steps) and at most {a.max_steps} steps or the first "
         f"evaluation after {a.max_seconds:.0f} s of training"
         + "".join(f" ({CONFIGS[k][3]}: {v:.0f} s)" for k, v in sorted(a.max_seconds_for.items()))
         + ". The 10k test images are "
         f"evaluated every {a.eval_every} steps (every PS configuration: with raw pulls the "
         f"compressed pushes' steps are not much shorter; DDP uncompressed) or every "
         f"{a.eval_every_compressed} (DDP PowerSGD), each worker a quarter of them with the "
         f"parameters it pulled (fp16-rounded with fp16 pulls), the clock paused. Warm-up: "
         f"{a.warmup} raw pushes before top-k and 1-bit (DDP: {a.warmup} uncompressed steps "
         f"before PowerSGD); fp16 from the start. One intra-op thread per process; malloc: "
         + ("`GLIBC_TUNABLES=" + rc.MALLOC_REUSE + "` for every process (see compression.md, "
            "\"Malloc\")." if a.malloc == "reuse" else "glibc's defaults.")]
    rates = []
    for r in rows:
        if r["rate"] not in rates:
            rates.append(r["rate"])
    for rate in rates:
        names = [n for n in CONFIGS if any(r["config"] == n and r["rate"] == rate for r in rows)]
        S = {n: summarize(rows, n, rate, a.min_steps) for n in names}
        base = S.get("ps-none", {"runs": 0})
        ddp = S.get("ddp-none", {"runs": 0})
        # The last step at which every run that finished was evaluated: where all compare when
        # a run stopped on its time budget before --min-steps.
        common = None
        for r in rows:
            if r["rate"] == rate and "failed" not in r:
                at = {e[0] for e in r["evals"]}
                common = at if common is None else common & at
        common = max(common) if common else None
        show_common = common is not None and common != a.min_steps
        for n in names:
            S[n]["at_common"] = rc.med(rc.accuracy_at(r, common) for r in rows
                                       if r["config"] == n and r["rate"] == rate
                                       and "failed" not in r) if show_common else None
        L += ["", f"## {rate}", "",
              "Medians over the runs (runs: how many; failed runs are counted apart). "
              "bytes/step MB: PS: worker 0's payload bytes pushed + pulled (`Client::traffic()`, "
              "both servers, the half its own host's server holds included; headers not "
              "counted); DDP: rank 0's sends (`stats().bytesSent`, shared memory to its host "
              "peer included); over all steps, warm-up included, and over the steps after the "
              "warm-up only. link MB/step: what host 1's interface sent (every process of the "
              "host, TCP/IP headers included) per step, warm-up included; host 2's is the "
              "mirror image. link s/step: that over the rate, the least time a step's "
              "communication can take. step s: median wall time of worker 0's steps after the "
              "warm-up (forward, backward, push and pull). Time to target: training seconds "
              "until the first evaluation at or above the target (steps in brackets). vs PS "
              "uncompressed / vs DDP uncompressed: that configuration's time to the target over "
              "this one's (\">\": it did not reach the target within its run, so its training "
              f"time is a lower bound). Accuracy at step {a.min_steps}: equal steps for all "
              f"(\"-\": the run stopped on its time budget before)"
              + (f"; at step {common:.0f}: the last step every run was evaluated at." if
                 show_common else "."), "",
              "| configuration | spec (lr, momentum) | runs | bytes/step MB, all steps | "
              "bytes/step MB, compressed steps | link MB/step | link s/step | step s | time to "
              f"target s (steps) | vs PS uncompressed | vs DDP uncompressed | accuracy at step "
              f"{a.min_steps} | "
              + (f"accuracy at step {common:.0f} | " if show_common else "")
              + "accuracy at the end (step) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if show_common else "")
              + "---|"]

        def ratio(ref, s):
            if not ref.get("runs") or not s.get("to_target"):
                return "-"
            if ref.get("to_target"):
                return f"{ref['to_target'] / s['to_target']:.2f}x"
            if ref.get("not_reached_seconds"):
                return f"> {ref['not_reached_seconds'] / s['to_target']:.2f}x"
            return "-"

        for n in names:
            s = S[n]
            if s["runs"] == 0:
                L.append(f"| {CONFIGS[n][3]} | {spec_of(n, a)} | 0 ({s['failed']} failed: "
                         f"{s['why']}) | | | | | | | | | |" + (" |" if show_common else "") + " |")
                continue
            s["link_s"] = s["link_bytes_per_step"] / rc.rate_bytes_per_second(rate) \
                if s["link_bytes_per_step"] is not None and rate != "none" else None
            last = s["last"]
            spec = last["spec"] + (" + fp16 pull" if last.get("pull_half") else "")
            tt = (f"{s['to_target']:.1f} ({s['steps_to_target']:.0f})" if s["to_target"] else
                  f"not reached in {s['steps']:.0f} steps ({s['reached']}/{s['runs']} runs)")
            failed = f" (+{s['failed']} failed)" if s["failed"] else ""
            L.append(f"| {CONFIGS[n][3]} | {spec} ({last['lr']}, {last.get('momentum', '-')}) | "
                     f"{s['runs']}{failed} | {bytes_cell(s)} | {bytes_cell(s, '_compressed')} | "
                     f"{rc.mb(s['link_bytes_per_step'])} | {rc.fmt(s['link_s'], '.2f')} | "
                     f"{rc.fmt(s['median_step_seconds'], '.2f')} | {tt} | {ratio(base, s)} | "
                     f"{ratio(ddp, s)} | {rc.fmt(s['at_min'], '.4f')} | "
                     + (f"{rc.fmt(s['at_common'], '.4f')} | " if show_common else "")
                     + f"{rc.fmt(s['final_accuracy'], '.4f')} ({s['steps']:.0f}) |")
        L += ["", "What limits each number (medians above; compute, the codecs and the servers "
              "share the 2 cores with every other process of the job):", ""]
        for n in names:
            s = S[n]
            if not s["runs"]:
                continue
            parts = []
            if s.get("link_s") is not None and s["median_step_seconds"]:
                share = s["link_s"] / s["median_step_seconds"]
                parts.append(f"step {s['median_step_seconds']:.2f} s, of which the link needs at "
                             f"least {s['link_s']:.2f} s ({100 * share:.0f}%)")
            push_c, pull_c = s.get("pushed_bytes_per_step_compressed"), \
                s.get("pulled_bytes_per_step_compressed")
            if push_c is not None and pull_c is not None and push_c + pull_c > 0:
                parts.append(f"after the warm-up the pulls are {100 * pull_c / (push_c + pull_c):.0f}% "
                             f"of the payload ({rc.mb(pull_c)} of {rc.mb(push_c + pull_c)} MB)")
            ref = ddp if ddp.get("steps_to_target") else None
            if ref and s["steps_to_target"] and n != "ddp-none":
                parts.append(f"{s['steps_to_target']:.0f} steps to the target vs DDP "
                             f"uncompressed's {ref['steps_to_target']:.0f}")
            # Uncompressed PS applies DDP's update (the same curve), so DDP's steps to the
            # target are its own; for the codecs they are not.
            if n == "ps-none" and not s["to_target"] and ref and s["median_step_seconds"]:
                proj = ref["steps_to_target"] * s["median_step_seconds"]
                parts.append(f"not reached in {s['train_seconds']:.0f} s ({s['steps']:.0f} steps); "
                             f"a projection, not a measurement: at its step time, the "
                             f"{ref['steps_to_target']:.0f} steps uncompressed DDP took would be "
                             f"about {proj:.0f} s")
            w = a.warmup if codec_of(n) in rc.WARMED else 0
            warm = base if base.get("median_step_seconds") and CONFIGS[n][0] == "ps" else ddp
            if w and warm.get("median_step_seconds") and s["to_target"]:
                parts.append(f"{w} raw warm-up steps, about "
                             f"{w * warm['median_step_seconds']:.1f} s of the "
                             f"{s['to_target']:.1f} s to the target")
            busy = [r["other_processes"]["cores"] for r in rows
                    if r["config"] == n and r["rate"] == rate and "failed" not in r
                    and r.get("other_processes", {}).get("cores") is not None]
            if busy:
                parts.append(f"processes outside the run used {', '.join(f'{b:.2f}' for b in busy)} "
                             f"of the {os.cpu_count()} cores on average during it"
                             f"{' (per run)' if len(busy) > 1 else ''}")
            L.append(f"- {CONFIGS[n][3]}: " + "; ".join(parts) + ".")
        L += ["", "Accuracy at each evaluation (step: accuracy; the last run of each):", ""]
        for n in names:
            s = S[n]
            if s["runs"]:
                L.append(f"- {CONFIGS[n][3]}: " + ", ".join(
                    f"{e[0]:.0f}: {e[2]:.3f}" for e in s["last"]["evals"]))
        reports = next((S[n]["last"].get("server_reports") for n in names
                        if S[n]["runs"] and S[n]["last"].get("server_reports")), None)
        if reports:
            L += ["", "The partition (server 0's report, last PS run):", ""]
            for line in reports[0].get("partition", "").splitlines():
                L.append(f"    {line}")
        fails = [r for r in rows if r["rate"] == rate and "failed" in r]
        if fails:
            L += ["", "Failed runs:", ""] + [f"- {CONFIGS[r['config']][3]}, repetition "
                                             f"{r['rep']}: {r['failed']}" for r in fails]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
