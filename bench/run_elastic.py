#!/usr/bin/python3
"""Elastic-recovery benchmark: what it costs when one of 4 workers dies in the middle of training,
Shoal's elastic job against torchrun's restart-from-checkpoint, on the same model, data order,
batch and optimizer (Fashion-MNIST, MLP 784-256-256-10, batch 64 per rank, SGD lr 0.05 momentum
0.9, one thread per process). Each repetition runs, one after the other (so drifts of a shared
machine hit every variant alike):
  (a) Shoal, clean:    build/shoal run -q --elastic 2:4 -n 4 -- build/bench/elastic_train --steps N
  (b) Shoal, a kill:   the same with --kill-member M --kill-step S: member M SIGKILLs itself after
                       step S's forward pass; the 3 survivors agree on a new view and go on from
                       the state they hold in memory (no restart, no disk: they finish at world 3)
  (b') shoal-zero2:    (a) and (b) with ZeRO stage 2 (--zero 2, train/zero/zero_elastic.h): each
                       rank holds a shard and the previous rank's copy; the survivors reshard
  (c) torchrun, clean: /usr/bin/python3 -m torch.distributed.run --nnodes=1:1 --nproc_per_node=4
                       --max_restarts 3 --rdzv_backend=c10d ... bench/torchrun_elastic.py
  (d) torchrun, a kill: the same with --kill-rank R --kill-step S: the agent notices the death,
                       stops the other 3 workers, rendezvouses again and starts 4 new processes,
                       which reload the last checkpoint (every --ckpt-every steps) and go on at 4
What is measured, for each killed run (all times are time.time() of processes on this machine):
  recovery   the first step completed after the failure minus the victim's last word, printed
             just before it killed itself. For torchrun this includes the agent noticing (it
             polls its workers every monitor interval, 5 s by default), stopping the survivors,
             the new rendezvous, starting 4 interpreters, `import torch`, the process group, data
             loading and the checkpoint read: everything a torchrun user waits for.
  work lost  (S - 1) - resumed_step: steps that had completed before the kill and were done
             again (torchrun: S - 1 minus the checkpoint's step; Shoal: what the survivors had
             committed but could not continue from).
  accuracy   final test accuracy minus the median clean run of the same system, in points.
  wall       the whole job's seconds, and its excess over the median clean job of the system.
The targets printed at the end (and written to the report): Shoal's survivors resume within 2 s
of the kill, lose at most 1 step, end within 0.3 points of Shoal's clean accuracy, and recover at
least 10x faster than torchrun (median recovery over median recovery). Targets are judged on
the medians; the report also shows the worst repetition.

Writes bench/results/<name>.md (the table, the per-run rows, notes on the machine and the
method) and <name>.jsonl (one row per run: the parsed output lines and the derived numbers).
Every process gets OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1, every job a time limit (the whole
process group is killed when it runs over; the run is then recorded as failed and the next one
goes on). Keep the machine otherwise idle while it runs.

usage: /usr/bin/python3 bench/run_elastic.py [--reps 3] [--steps 240] [--kill-step 120]
       [--kill-member 2] [--kill-rank 2] [--ckpt-every 20] [--systems shoal,shoal-zero2,torchrun]
       [--kinds clean,kill] [--monitor-interval SECONDS] [--timeout 300] [--build DIR]
       [--out DIR] [--name elastic] [--quick]
--quick: a smoke test (--steps 40 --kill-step 25 --reps 1), written as elastic_quick.{md,jsonl}
unless --name says otherwise, so that it never overwrites a real result.
--monitor-interval passes torchrun's --monitor_interval (left out: torchrun's default, 5 s).
torchrun is run as `/usr/bin/python3 -m torch.distributed.run` (Debian's python3-torch; the
python3 first on PATH may lack torch); torch 1.13 spells its options with underscores, and with
Python 3.11 needs --redirects/--tee set to a non-zero value (see torchrun_cmd)."""
import argparse, json, os, platform, re, shutil, signal, socket, statistics, subprocess, sys
import tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
TORCH_PYTHON = "/usr/bin/python3"
PREFIX = re.compile(r"^\[\d+\] ")  # shoal run's "[rank] " before each line of a rank

# Targets for Shoal's killed runs (medians over the repetitions).
TARGET_RECOVERY_S = 2.0
TARGET_LOST_STEPS = 1
TARGET_ACCURACY_POINTS = 0.3
TARGET_SPEEDUP = 10.0


def free_port():
    # The OS picks a port nobody listens on; released at once, so another process could take it
    # before torchrun does, which is unlikely enough on an otherwise idle machine.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(cmd, timeout, cwd):
    """Runs cmd in its own process group; on timeout (or ^C) kills the whole group, so no worker
    outlives its job. Returns (exit code or None on timeout, stdout, stderr, wall seconds)."""
    t0 = time.time()
    p = subprocess.Popen(cmd, env=ENV, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, time.time() - t0
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err, time.time() - t0
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise


def json_lines(text):
    """Every JSON object line of a job's stdout, with shoal run's rank prefix taken off."""
    rows = []
    for line in text.splitlines():
        line = PREFIX.sub("", line, count=1)
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # two ranks' lines can interleave; a result line that did is caught below
    return rows


SHOAL_SYSTEMS = ("shoal", "shoal-zero2")  # DDP; ZeRO stage 2 (train/zero/zero_elastic.h)
SYSTEMS = SHOAL_SYSTEMS + ("torchrun",)


def shoal_cmd(a, kill, system):
    cmd = [os.path.join(a.build, "shoal"), "run", "-q", "--elastic", "2:4", "-n", "4",
           "--time-limit", str(max(10, a.timeout - 10)),
           "-x", "OPENBLAS_NUM_THREADS", "-x", "OMP_NUM_THREADS", "--",
           os.path.join(a.build, "bench", "elastic_train"), "--steps", str(a.steps)]
    if system == "shoal-zero2":
        cmd += ["--zero", "2"]
    if kill:
        cmd += ["--kill-member", str(a.kill_member), "--kill-step", str(a.kill_step)]
    return cmd


def torchrun_cmd(a, kill, ckpt):
    cmd = [TORCH_PYTHON, "-m", "torch.distributed.run", "--nnodes=1:1", "--nproc_per_node=4",
           "--max_restarts=3", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}"]
    if a.monitor_interval is not None:
        cmd.append(f"--monitor_interval={a.monitor_interval}")
    # torch 1.13 under Python 3.11 crashes on its own defaults (--redirects 0 --tee 0): its
    # Std.from_str looks the value up by iterating the IntFlag, and 3.11 leaves the zero member
    # (and the ALL alias) out of the iteration. 2 (stderr) is the one value that parses and
    # leaves stdout, where the JSON lines go, untouched: the workers' stderr goes to a file under
    # --log_dir and is copied to the console with a "[default<rank>]:" prefix.
    cmd += ["--redirects=2", "--tee=2", f"--log_dir={os.path.join(os.path.dirname(ckpt), 'logs')}"]
    cmd += [os.path.join(ROOT, "bench", "torchrun_elastic.py"), "--steps", str(a.steps),
            "--ckpt", ckpt, "--ckpt-every", str(a.ckpt_every)]
    if kill:
        cmd += ["--kill-rank", str(a.kill_rank), "--kill-step", str(a.kill_step)]
    return cmd


def fraction(acc):
    # The torchrun peer prints a fraction; accept a percentage from the Shoal program as well.
    return acc / 100.0 if acc is not None and acc > 1.0 else acc


def one_run(a, system, kind, rep):
    """Runs one job; returns its row: what it printed, what follows from it, or why it failed."""
    kill = kind == "kill"
    # A fresh working directory per job: the torchrun checkpoint (which must not exist at the
    # start) and anything the Shoal program writes next to it go there and are removed after.
    work = tempfile.mkdtemp(prefix=f"elastic_{system}_")
    try:
        cmd = (shoal_cmd(a, kill, system) if system in SHOAL_SYSTEMS
               else torchrun_cmd(a, kill, os.path.join(work, "ckpt.pt")))
        rc, out, err, wall = run_job(cmd, a.timeout, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = json_lines(out)
    kills = [l for l in lines if l.get("event") == "kill"]
    results = [l for l in lines if l.get("impl") == system]
    row = {"system": system, "kind": kind, "rep": rep, "wall_seconds": wall, "exit": rc,
           "command": " ".join(cmd), "kill": kills[0] if kills else None,
           "result": results[-1] if results else None, "error": None}
    res = row["result"]
    if rc is None:
        row["error"] = f"timed out after {a.timeout} s"
    elif rc != 0:
        row["error"] = f"exit {rc}"
    elif res is None:
        row["error"] = "no result line"
    elif kill and len(kills) != 1:
        row["error"] = f"{len(kills)} kill lines (expected 1)"
    elif kill and res.get("first_step_after") is None:
        row["error"] = "no step completed after the kill was reported"
    elif not kill and kills:
        row["error"] = "a kill in a clean run"
    if row["error"]:
        row["output_tail"] = (out[-2000:] + "\n--- stderr ---\n" + err[-3000:])
        return row
    row["accuracy"] = fraction(res.get("final_accuracy"))
    if kill:
        t_kill = row["kill"]["time"]
        row["recovery_seconds"] = res["first_step_after"] - t_kill
        row["work_lost_steps"] = (a.kill_step - 1) - res["resumed_step"]
        if system == "torchrun":
            # Where torchrun's recovery goes: until the new attempt's main() starts (the agent's
            # detection, stopping the group, rendezvous, new interpreters, `import torch`), then
            # up to the first step (process group, data, checkpoint, the step itself).
            row["until_script_start"] = res["script_start"] - t_kill
            row["until_main"] = res["attempt_start"] - t_kill
            row["main_to_first_step"] = res["first_step_after"] - res["attempt_start"]
            if res.get("caught_up") is not None:
                row["until_caught_up"] = res["caught_up"] - t_kill
    return row


def med(values):
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def percent(x):
    return None if x is None else x * 100


def fmt(x, digits=2, unit=""):
    return "n/a" if x is None else f"{x:.{digits}f}{unit}"


def summarize(rows, systems):
    """Adds accuracy deltas and excess wall time to each killed row; returns per-system medians."""
    summary = {}
    for s in systems:
        ok = [r for r in rows if r["system"] == s and not r["error"]]
        clean = [r for r in ok if r["kind"] == "clean"]
        killed = [r for r in ok if r["kind"] == "kill"]
        clean_acc = med(r["accuracy"] for r in clean)
        clean_wall = med(r["wall_seconds"] for r in clean)
        for r in killed:
            r["accuracy_delta_points"] = (None if clean_acc is None or r["accuracy"] is None
                                          else (r["accuracy"] - clean_acc) * 100)
            r["extra_wall_seconds"] = None if clean_wall is None else r["wall_seconds"] - clean_wall
        def col(key, rs=killed):
            return [r.get(key) for r in rs if r.get(key) is not None]
        summary[s] = {
            "clean_runs": len(clean), "killed_runs": len(killed),
            "failed": sum(1 for r in rows if r["system"] == s and r["error"]),
            "clean_accuracy": clean_acc, "clean_wall": clean_wall,
            "killed_accuracy": med(col("accuracy")),
            "recovery": med(col("recovery_seconds")),
            "recovery_worst": max(col("recovery_seconds"), default=None),
            "recovery_best": min(col("recovery_seconds"), default=None),
            "lost": med(col("work_lost_steps")),
            "lost_worst": max(col("work_lost_steps"), default=None),
            "delta": med(col("accuracy_delta_points")),
            "delta_worst": min(col("accuracy_delta_points"), default=None),
            "extra_wall": med(col("extra_wall_seconds")),
            "until_script_start": med(col("until_script_start")),
            "until_main": med(col("until_main")),
            "main_to_first_step": med(col("main_to_first_step")),
            "until_caught_up": med(col("until_caught_up")),
            "step_ms": med([r["result"]["step_seconds"] * 1000 for r in clean
                            if r["result"].get("step_seconds") is not None]),
            # Shoal's own account (ElasticState: the failure caught to the new group formed).
            "self_recovery": med([r["result"].get("recovery_seconds") for r in killed]),
        }
    return summary


def targets(summary):
    """(description, met or None when it cannot be judged, the numbers) per target."""
    tr = summary.get("torchrun")
    out = []
    for name in SHOAL_SYSTEMS:
        out += shoal_targets(summary.get(name), tr, "Shoal" if name == "shoal" else name)
    failed = sum(s["failed"] for s in summary.values())
    if failed:
        out.append(("every run completed", False, f"{failed} failed (see the report)"))
    return out


def shoal_targets(sh, tr, who):
    out = []
    if sh and sh["killed_runs"]:
        out.append((f"Shoal survivors resume within {TARGET_RECOVERY_S:g} s of the kill",
                    sh["recovery"] <= TARGET_RECOVERY_S,
                    f"median {fmt(sh['recovery'])} s, worst {fmt(sh['recovery_worst'])} s"))
        out.append((f"Shoal loses <= {TARGET_LOST_STEPS} step",
                    sh["lost"] <= TARGET_LOST_STEPS,
                    f"median {sh['lost']:g}, worst {sh['lost_worst']:g}"))
        d = sh["delta"]
        # One-sided: the killed run must reach the clean accuracy less the margin; ending higher
        # (the smaller world after the kill can happen to help) is no failure of recovery.
        out.append((f"Shoal's killed run reaches its clean accuracy within "
                    f"{TARGET_ACCURACY_POINTS:g} points", None if d is None
                    else d >= -TARGET_ACCURACY_POINTS,
                    f"median {fmt(d, 2, ' points')}, worst {fmt(sh['delta_worst'], 2, ' points')}"))
    if sh and tr and sh["recovery"] and tr["recovery"]:
        ratio = tr["recovery"] / sh["recovery"]
        out.append((f"Shoal recovers >= {TARGET_SPEEDUP:g}x faster than torchrun",
                    ratio >= TARGET_SPEEDUP, f"{ratio:.1f}x"))
    return [(d.replace("Shoal", who, 1), met, n) for d, met, n in out]


def git_revision():
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_report(path, a, rows, summary, goals):
    systems = [s for s in SYSTEMS if s in summary]
    torch_version = next((r["result"].get("torch_version") for r in rows
                          if r["system"] == "torchrun" and r.get("result")), None)
    L = ["# Elastic recovery: one of 4 workers killed mid-training", "",
         f"Machine: {platform.node()}, {os.cpu_count()} cores, 4 ranks on loopback (more ranks "
         "than cores: every process competes for the CPU). "
         f"Medians of {a.reps} repetition{'s' if a.reps != 1 else ''}. Shoal revision "
         f"{git_revision()}"
         + (f"; torch {torch_version}" if torch_version else "") + ". Generated by "
         "`bench/run_elastic.py`" + (" --quick (a smoke test)" if a.quick else "") + ".", "",
         f"Job: Fashion-MNIST, MLP 784-256-256-10, batch 64 per rank, SGD lr 0.05 momentum 0.9, "
         f"{a.steps} steps, one thread per process. Kill: after the forward pass of step "
         f"{a.kill_step} (steps count from 1), Shoal member {a.kill_member}, torchrun rank "
         f"{a.kill_rank}; torchrun checkpoints every {a.ckpt_every} steps. torchrun monitor "
         "interval: " + (f"{a.monitor_interval:g} s" if a.monitor_interval is not None
                         else "its default, 5 s") + ".", "",
         "| system | clean accuracy (%) | clean job (s) | recovery (s) | work lost (steps) | "
         "accuracy vs clean (points) | killed job's excess wall (s) | world after |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in systems:
        m = summary[s]
        world = next((r["result"].get("world") for r in rows if r["system"] == s
                      and r["kind"] == "kill" and not r["error"]), None)
        rec = ("n/a" if m["recovery"] is None else
               f"{m['recovery']:.2f} ({m['recovery_best']:.2f}-{m['recovery_worst']:.2f})")
        L.append(f"| {s} | {fmt(percent(m['clean_accuracy']))}"
                 f" | {fmt(m['clean_wall'], 1)} | {rec} | {fmt(m['lost'], 0)} | "
                 f"{fmt(m['delta'], 2)} | {fmt(m['extra_wall'], 1)} | {world or 'n/a'} |")
    for s in SHOAL_SYSTEMS:
        if s in summary and "torchrun" in summary and summary[s]["recovery"] \
                and summary["torchrun"]["recovery"]:
            L += ["", f"torchrun recovery / {s} recovery: "
                      f"**{summary['torchrun']['recovery'] / summary[s]['recovery']:.1f}x**."]
    L += ["", "## Targets", ""]
    for desc, met, numbers in goals:
        verdict = "cannot judge" if met is None else ("met" if met else "**NOT met**")
        L.append(f"- {desc}: {verdict} ({numbers})")
    tr = summary.get("torchrun")
    if tr and tr["recovery"] is not None:
        L += ["", "## Where torchrun's recovery goes (medians, seconds after the kill)", "",
              f"- the new attempt's interpreter starts (agent detection, stopping the group, "
              f"rendezvous, spawning): {fmt(tr['until_script_start'])}",
              f"- its main() starts (after `import torch`): {fmt(tr['until_main'])}",
              f"- main() to the first completed step (process group, data, checkpoint): "
              f"{fmt(tr['main_to_first_step'])}",
              f"- back at the step it had reached (the lost work redone): "
              f"{fmt(tr['until_caught_up'])}",
              f"- for scale, a clean run's median step: {fmt(tr['step_ms'], 1)} ms"]
    for s in SHOAL_SYSTEMS:
        sh = summary.get(s)
        if sh and sh["self_recovery"] is not None:
            L += ["", f"{s}'s own measure of its recovery (ElasticState: the failure caught to "
                      f"the new group formed, and for ZeRO the shards resharded), median: "
                      f"{fmt(sh['self_recovery'], 3)} s."]
    L += ["", "## Runs", "",
          "| rep | system | kind | job (s) | accuracy (%) | recovery (s) | resumed at | "
          "work lost | error |", "|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        res = r.get("result") or {}
        acc = r.get("accuracy")
        L.append(f"| {r['rep']} | {r['system']} | {r['kind']} | {r['wall_seconds']:.1f} | "
                 f"{fmt(percent(acc))} | {fmt(r.get('recovery_seconds'))} | "
                 f"{res.get('resumed_step', '') if r['kind'] == 'kill' else ''} | "
                 f"{r.get('work_lost_steps', '')} | {r['error'] or ''} |")
    L += ["", "## Notes", "",
          "- Recovery is the first step completed after the failure minus the time the victim "
          "printed just before SIGKILLing itself (both `time.time()` on this machine). It counts "
          "only getting back to training; the lost work (torchrun redoes up to "
          f"{a.ckpt_every - 1} steps with a checkpoint every {a.ckpt_every}) is counted apart, "
          "and shows in the killed job's excess wall time.",
          "- torchrun's recovery includes the whole start-up of 4 new processes (interpreter, "
          "`import torch`, gloo process group, reading the data set and the checkpoint): that "
          "is what its restart-the-group model costs. Its agent polls the workers every monitor "
          "interval, so up to that long passes before it notices the death. Shoal's survivors "
          "keep their processes and their state; only the view changes.",
          "- The worlds differ after the kill: Shoal's survivors finish at 3 (no restart "
          "asked), torchrun restarts all 4. So Shoal's killed run trains on a smaller global "
          "batch for the rest of the job; its accuracy difference measures that as well as the "
          "recovery. torchrun's killed run redoes the same steps on the same data from an exact "
          "checkpoint, so its accuracy should equal its clean run's.",
          "- 4 ranks on 2 cores: start-up and step times are those of an oversubscribed machine, "
          "slower than on one core per rank; both systems pay it alike.",
          "- Work lost = (kill step - 1) - the step training continued from.",
          "- torchrun ran with `--redirects 2 --tee 2` (workers' stderr to a log file, copied to "
          "the console): torch 1.13 under Python 3.11 fails to parse its own defaults for these "
          "(0). stdout, where the JSON lines go, is untouched.",
          "- Accuracy deltas are one run against another; at few steps (--quick) they are "
          "dominated by the different trajectory after the kill, not by recovery."]
    failed = [r for r in rows if r["error"]]
    if failed:
        L += ["", "## Failed runs", ""]
        for r in failed:
            L += [f"- rep {r['rep']}, {r['system']} {r['kind']}: {r['error']}", "",
                  "```", r.get("output_tail", "")[-1500:], "```"]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3; --quick 1)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 240)")
    p.add_argument("--kill-step", type=int, default=None,
                   help="the step whose forward pass the victim dies after (default 120)")
    p.add_argument("--kill-member", type=int, default=2, help="Shoal's victim")
    p.add_argument("--kill-rank", type=int, default=2, help="torchrun's victim")
    p.add_argument("--ckpt-every", type=int, default=20, help="torchrun checkpoint interval")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--kinds", default="clean,kill")
    p.add_argument("--monitor-interval", type=float, default=None,
                   help="torchrun --monitor_interval seconds (default: torchrun's, 5)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per job")
    p.add_argument("--quick", action="store_true", help="smoke test: 40 steps, kill at 25, 1 rep")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--name", default=None, help="output files <name>.md and <name>.jsonl "
                   "(default elastic; --quick: elastic_quick)")
    a = p.parse_args()
    # A SIGTERM (timeout(1), a batch system) becomes SystemExit, so that run_job's handler kills
    # the running job's process group instead of leaving its workers behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    quick = {"reps": 1, "steps": 40, "kill_step": 25, "name": "elastic_quick"}
    full = {"reps": 3, "steps": 240, "kill_step": 120, "name": "elastic"}
    for k, v in (quick if a.quick else full).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.build = os.path.abspath(a.build)
    systems = [s for s in a.systems.split(",") if s]
    kinds = [k for k in a.kinds.split(",") if k]
    if set(systems) - set(SYSTEMS) or not systems:
        raise SystemExit("--systems: a comma-separated subset of " + ",".join(SYSTEMS))
    if set(kinds) - {"clean", "kill"} or not kinds:
        raise SystemExit("--kinds: a comma-separated subset of clean,kill")
    if not 1 <= a.kill_step <= a.steps:
        raise SystemExit(f"--kill-step must be in [1, --steps={a.steps}]")
    if set(systems) & set(SHOAL_SYSTEMS):
        for f in (os.path.join(a.build, "shoal"), os.path.join(a.build, "bench", "elastic_train")):
            if not os.access(f, os.X_OK):
                raise SystemExit(f"missing {f}: build it, or run --systems torchrun")
    if "torchrun" in systems and not os.access(TORCH_PYTHON, os.X_OK):
        raise SystemExit(f"missing {TORCH_PYTHON} (Debian's python3-torch)")

    rows = []
    for rep in range(a.reps):
        for system in systems:
            for kind in kinds:
                row = one_run(a, system, kind, rep)
                rows.append(row)
                brief = {k: row.get(k) for k in ("rep", "system", "kind", "wall_seconds",
                                                 "accuracy", "recovery_seconds",
                                                 "work_lost_steps", "error")}
                print(json.dumps(brief), flush=True)
                if row["error"]:
                    print(row.get("output_tail", ""), file=sys.stderr, flush=True)
    summary = summarize(rows, systems)
    goals = targets(summary)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + ".jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    write_report(os.path.join(a.out, a.name + ".md"), a, rows, summary, goals)
    for s, m in summary.items():
        print(f"{s}: clean accuracy {fmt(percent(m['clean_accuracy']), 2, '%')}, "
              f"recovery {fmt(m['recovery'])} s, work lost {fmt(m['lost'], 0)} steps, "
              f"accuracy vs clean {fmt(m['delta'])} points, failed runs {m['failed']}")
    for desc, met, numbers in goals:
        print(f"{desc}: {'cannot judge' if met is None else ('met' if met else 'NOT met')} "
              f"({numbers})")
    print(f"wrote {os.path.join(a.out, a.name + '.md')} and .jsonl")


if __name__ == "__main__":
    main()
