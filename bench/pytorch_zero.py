#!/usr/bin/python3
"""The ZeRO benchmark's PyTorch peer (bench/run_zero.py): the MLP, data, batch per process and
Adam of bench/zero_train.cpp -- a Sequential of --depth Linear(width, width) layers with a ReLU
between consecutive ones, one random batch per process drawn once, MSE -- trained with PyTorch's
DistributedDataParallel (gloo, gradient_as_bucket_view=True: the gradients are views into the
buckets, as Shoal's are) and
  --variant ddp   torch.optim.Adam on every process
  --variant zero  torch.distributed.optim.ZeroRedundancyOptimizer(optimizer_class=torch.optim.Adam)
                  (ZeRO stage 1: each process steps its share of the parameters, then they are
                  broadcast from their owners)
one intra-op thread per process. Prints the RESULT line of zero_train.cpp from rank 0 (memory of
rank 0 right after the last backward, before its step: parameters, gradients and optimizer
state from the tensors, each storage once; peak RSS from VmHWM).

The parent starts --procs processes of this file (--rank r) itself, with a file store in a
temporary folder (no port to choose: gloo's listeners take ports the OS picks), each under the
optional --wrap prefix (bench/run_zero.py's per-process memory limit, bench/mem_limit.py). When
a process fails, the parent kills the others and exits with its code: a process that ran out
of memory exits 3 (or is killed by the kernel: the parent exits 128 + signal).

usage: /usr/bin/python3 bench/pytorch_zero.py --procs N [--variant ddp|zero] [--width 2048]
       [--depth 6] [--batch 32] [--steps 10] [--warmup 3] [--wrap "PREFIX ..."]
(Debian's python3-torch lives under /usr/bin/python3.)"""
import argparse, ctypes, datetime, os, shlex, signal, subprocess, sys, tempfile, time

OOM_EXIT = 3


def peak_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


def storage_bytes(tensors):
    seen = {}
    for t in tensors:
        if t is not None:
            s = t.storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def worker(a):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{a.store}", rank=a.rank,
                            world_size=a.procs, timeout=datetime.timedelta(seconds=a.timeout))
    torch.manual_seed(a.seed)  # the same initial model on every process
    layers = []
    for i in range(a.depth):
        layers.append(nn.Linear(a.width, a.width))
        if i + 1 < a.depth:
            layers.append(nn.ReLU())
    net = nn.Sequential(*layers)
    params = sum(p.numel() for p in net.parameters())
    gen = torch.Generator().manual_seed(a.seed * 1000 + 7 + a.rank)
    x = torch.normal(0.0, 1.0, (a.batch, a.width), generator=gen)
    y = torch.normal(0.0, 1.0, (a.batch, a.width), generator=gen)
    ddp = nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=True)
    if a.variant == "zero":
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=a.lr)
        local = opt.optim  # the optimizer over this process's share
    else:
        opt = local = torch.optim.Adam(ddp.parameters(), lr=a.lr)
    mem = [0, 0, 0, 0]
    step_s = []
    loss = 0.0
    start = time.perf_counter()
    for k in range(a.warmup + a.steps):
        if k == a.warmup:
            dist.barrier()
            start = time.perf_counter()
        t0 = time.perf_counter()
        ddp.zero_grad()
        l = nn.functional.mse_loss(ddp(x), y)
        l.backward()
        if k + 1 == a.warmup + a.steps:
            state = [v for s in local.state.values() for v in s.values() if torch.is_tensor(v)]
            mem = [storage_bytes(net.parameters()), storage_bytes(p.grad for p in net.parameters()),
                   storage_bytes(state), peak_rss()]
        opt.step()
        loss = l.item()
        if k >= a.warmup:
            step_s.append(time.perf_counter() - t0)
    dist.barrier()
    seconds = time.perf_counter() - start
    peak = torch.tensor([mem[3]], dtype=torch.int64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if a.rank == 0:
        step_s.sort()
        n = len(step_s)
        med = step_s[n // 2] if n % 2 else 0.5 * (step_s[n // 2 - 1] + step_s[n // 2])
        print(f"RESULT variant=torch-{a.variant} ranks={a.procs} width={a.width} depth={a.depth} "
              f"batch={a.batch} params={params} steps={a.steps} seconds={seconds:.4f} "
              f"samples_per_s={a.steps * a.batch * a.procs / seconds:.2f} step_ms={med * 1e3:.2f} "
              f"loss={loss:.6g} param_bytes={mem[0]} grad_bytes={mem[1]} optim_bytes={mem[2]} "
              f"peak_rss={mem[3]} peak_rss_max={int(peak.item())}", flush=True)
    dist.destroy_process_group()


def run_worker(a):
    try:
        worker(a)
    except MemoryError as e:
        print(f"pytorch_zero: rank {a.rank}: out of memory ({e})", file=sys.stderr)
        sys.exit(OOM_EXIT)
    except RuntimeError as e:
        # libtorch's failed allocation: "DefaultCPUAllocator: can't allocate memory".
        if "can't allocate memory" in str(e):
            print(f"pytorch_zero: rank {a.rank}: out of memory ({str(e).splitlines()[0]})",
                  file=sys.stderr)
            sys.exit(OOM_EXIT)
        raise


def die_with_parent():
    # A process killed with its launcher (a `timeout` in bench/run_zero.py): PR_SET_PDEATHSIG.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def launch(a, argv):
    """Starts the processes; returns the first failure's exit code, or 0."""
    with tempfile.TemporaryDirectory(prefix="pytorch_zero.") as d:
        store = os.path.join(d, "store")
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        procs = []
        for r in range(a.procs):
            cmd = shlex.split(a.wrap) + [sys.executable, os.path.abspath(__file__)] + argv + \
                ["--rank", str(r), "--store", store]
            procs.append(subprocess.Popen(cmd, env=env, start_new_session=True,
                                          preexec_fn=die_with_parent))
        code = 0
        try:
            running = list(procs)
            while running and code == 0:
                for p in list(running):
                    rc = p.poll()
                    if rc is None:
                        continue
                    running.remove(p)
                    if rc != 0:
                        code = rc if rc > 0 else 128 - rc
                        print(f"pytorch_zero: rank {procs.index(p)} failed ({rc}); stopping the "
                              f"others", file=sys.stderr)
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        return code


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--variant", choices=["ddp", "zero"], default="zero")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120, help="gloo's timeout, seconds")
    p.add_argument("--wrap", default="", help="command prefix for every process")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank is not None:
        run_worker(a)
        return
    # SIGTERM (timeout) stops the processes as a failure does: through launch()'s finally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    # The workers get the same options, less the launcher's own.
    argv, skip = [], False
    for x in sys.argv[1:]:
        if skip:
            skip = False
        elif x == "--wrap":
            skip = True
        elif not x.startswith("--wrap="):
            argv.append(x)
    sys.exit(launch(a, argv))


if __name__ == "__main__":
    main()
