#!/usr/bin/python3
"""The pipeline benchmark's PyTorch peers: the residual MLP of train/residual_mlp.h (the same
layers, in the same flat order), SGD (lr 0.05, momentum 0.9), cross-entropy, and synthetic data
(a few fixed-seed batches of N(0,1) images [B,1,28,28] with random labels, reused round-robin,
so data loading is out of the measurement), trained by one of:

  --variant plain  one process, plain training on the whole batch (no pipeline).
  --variant pipe   torch.distributed.pipeline.sync.Pipe (GPipe: forward of all micro-batches,
                   then backward) in one process, the model cut in 2 stages, both on the CPU.
                   Pipe wants the RPC framework up, so this initialises it with a single worker.
                   Note: Pipe runs the forward of every CPU partition on ONE worker thread (its
                   worker threads are keyed by device, and all CPU partitions are "cpu"), and the
                   backward runs on the autograd engine's single CPU thread, so on a CPU the two
                   stages never overlap: this row measures what Pipe's machinery costs.
  --variant rpc    a pipeline over torch.distributed.rpc in the style of PyTorch's "Distributed
                   Pipeline Parallelism Using RPC" tutorial: a driver holds RRefs to two stage
                   objects living in other processes; each micro-batch goes to stage 0 with
                   rpc remote() (the result stays there, as an RRef), stage 1 fetches it and its
                   output comes back to the driver through rpc_async; the driver concatenates,
                   computes the loss, and runs distributed autograd + DistributedOptimizer.
                   --rpc-procs 3 (default, as the tutorial): driver + 2 stage workers, i.e. 3
                   processes on this 2-core machine (the driver computes only the loss and the
                   concatenation, but its Python and RPC threads still take CPU); --rpc-procs 2:
                   the driver also hosts stage 0 (2 processes for 2 cores).

One intra-op thread per process (OMP/OpenBLAS env set to 1 before torch loads, and
torch.set_num_threads(1)). Every variant builds the full model from the same seed (the RPC stages
build it and keep their slice), so all start from the same weights. Only the steps after the
warm-up are timed; samples/s = batch * steps / their total time. Prints ONE JSON line:
  {"variant", "batch", "micro_batches", "steps", "warmup", "samples_per_second",
   "step_ms_median", "loss" (last step), "loss_first" (first step, warm-up included), ...}

usage: /usr/bin/python3 bench/pytorch_pipeline.py --variant plain|pipe|rpc [--batch 256]
       [--micro-batches 8] [--steps 30] [--warmup 5] [--blocks 12] [--hidden 256]
       [--split K (index in the flat layer list where stage 1 starts; default 2 + blocks//2)]
       [--checkpoint never|except_last (pipe)] [--rpc-procs 3|2 (rpc)] [--data-batches 4]
(Debian's python3-torch 1.13 lives under /usr/bin/python3.)"""
import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"  # before torch is imported; spawned processes inherit it

import argparse, json, statistics, sys, tempfile, threading, time
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

LR, MOMENTUM = 0.05, 0.9


class ResidualBlock(nn.Module):
    """x + fc2(relu(fc1(layer_norm(x)))), as train/residual_mlp.h."""

    def __init__(self, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, hidden)

    def forward(self, x):
        return x + self.fc2(F.relu(self.fc1(self.norm(x))))


def residual_mlp(blocks, hidden, seed):
    torch.manual_seed(seed)
    layers = [("flatten", nn.Flatten()), ("stem", nn.Linear(28 * 28, hidden))]
    layers += [(f"block{b}", ResidualBlock(hidden)) for b in range(blocks)]
    layers += [("norm", nn.LayerNorm(hidden)), ("head", nn.Linear(hidden, 10))]
    return nn.Sequential(OrderedDict(layers))


def cut(model, lo, hi):
    """Layers [lo, hi) of the flat Sequential, names kept."""
    return nn.Sequential(OrderedDict(list(model.named_children())[lo:hi]))


def synthetic_data(a):
    g = torch.Generator().manual_seed(a.seed + 1)
    x = torch.randn(a.data_batches, a.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (a.data_batches, a.batch), generator=g)
    return [(x[i], y[i]) for i in range(a.data_batches)]


def timed_loop(a, step):
    """Runs warm-up + timed steps of step(x, y) -> loss; returns the result row."""
    data = synthetic_data(a)
    times, losses = [], []
    for s in range(a.warmup + a.steps):
        x, y = data[s % len(data)]
        t0 = time.perf_counter()
        losses.append(step(x, y))
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
    total = sum(times)
    return {"samples_per_second": a.batch * a.steps / total if total > 0 else None,
            "step_ms_median": 1e3 * statistics.median(times) if times else None,
            "loss": losses[-1], "loss_first": losses[0], "seconds": total}


def result(a, row, **extra):
    out = {"variant": a.variant, "batch": a.batch,
           "micro_batches": 1 if a.variant == "plain" else a.micro_batches,
           "steps": a.steps, "warmup": a.warmup}
    out.update(row)
    out.update({"blocks": a.blocks, "hidden": a.hidden, "split": a.split,
                "intra_op_threads": torch.get_num_threads(), "torch": torch.__version__})
    out.update(extra)
    print(json.dumps(out), flush=True)


# ---- (a) plain ---------------------------------------------------------------------------------

def run_plain(a):
    model = residual_mlp(a.blocks, a.hidden, a.seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    result(a, timed_loop(a, step), processes=1)


# ---- (b) torch.distributed.pipeline.sync.Pipe --------------------------------------------------

def run_pipe(a):
    import torch.distributed.rpc as rpc
    from torch.distributed.pipeline.sync import Pipe

    with tempfile.TemporaryDirectory() as d:
        # Pipe insists on an RPC agent (its output is an RRef); a single worker, rendezvous
        # through a file store: no port to choose.
        rpc.init_rpc("pipe", rank=0, world_size=1,
                     rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
                         init_method=f"file://{os.path.join(d, 'store')}"))
        model = residual_mlp(a.blocks, a.hidden, a.seed)
        n = len(model)
        # Pipe makes each top-level child on the CPU a partition of its own: hand it two
        # children, the stages (it flattens each into its partition).
        stages = nn.Sequential(cut(model, 0, a.split), cut(model, a.split, n))
        pipe = Pipe(stages, chunks=a.micro_batches, checkpoint=a.checkpoint)
        assert len(pipe.partitions) == 2, len(pipe.partitions)
        opt = torch.optim.SGD(pipe.parameters(), lr=LR, momentum=MOMENTUM)

        def step(x, y):
            opt.zero_grad()
            out = pipe(x).local_value()
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            return loss.item()

        row = timed_loop(a, step)
        rpc.shutdown()
    result(a, row, processes=1, stages=2, checkpoint=a.checkpoint)


# ---- (c) pipeline over torch.distributed.rpc ---------------------------------------------------

class RpcStage(nn.Module):
    """One stage, living in a worker process. Builds the whole model from the shared seed and
    keeps layers [lo, hi), so the stages start from the same weights as the other variants. RPC
    requests arrive on the agent's thread pool; a lock runs one micro-batch at a time."""

    def __init__(self, blocks, hidden, seed, lo, hi):
        super().__init__()
        torch.set_num_threads(1)
        self.layers = cut(residual_mlp(blocks, hidden, seed), lo, hi)
        self.lock = threading.Lock()

    def forward(self, x_rref):
        x = x_rref.to_here()  # from the driver (stage 0) or from stage 0's process (stage 1)
        with self.lock:
            return self.layers(x)

    def parameter_rrefs(self):
        from torch.distributed.rpc import RRef
        return [RRef(p) for p in self.parameters()]


def rpc_names(procs):
    # Worker names in rank order, and which worker owns each stage.
    if procs == 3:
        return ["driver", "stage0", "stage1"], ["stage0", "stage1"]
    return ["driver", "stage1"], ["driver", "stage1"]


def rpc_process(rank, procs, store, a):
    import torch.distributed.rpc as rpc
    import torch.distributed.autograd as dist_autograd
    from torch.distributed.optim import DistributedOptimizer

    torch.set_num_threads(1)
    names, owners = rpc_names(procs)
    # Requests that wait on the stage lock each hold a pool thread while the micro-batches of
    # a step queue up: keep enough threads that the one which must answer never starves.
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{store}",
                                           num_worker_threads=max(16, 4 * a.micro_batches + 8))
    rpc.init_rpc(names[rank], rank=rank, world_size=procs, rpc_backend_options=opts)
    if rank == 0:
        n = 2 + a.blocks + 2
        bounds = [(0, a.split), (a.split, n)]
        stage_rrefs = [rpc.remote(owner, RpcStage, args=(a.blocks, a.hidden, a.seed, lo, hi))
                       for owner, (lo, hi) in zip(owners, bounds)]
        params = []
        for s in stage_rrefs:
            params += s.rpc_sync().parameter_rrefs()
        opt = DistributedOptimizer(torch.optim.SGD, params, lr=LR, momentum=MOMENTUM)

        def forward(x):
            futures = []
            for chunk in x.chunk(a.micro_batches):
                mid = stage_rrefs[0].remote().forward(rpc.RRef(chunk))
                futures.append(stage_rrefs[1].rpc_async().forward(mid))
            return torch.cat(torch.futures.wait_all(futures))

        def step(x, y):
            with dist_autograd.context() as cid:
                loss = F.cross_entropy(forward(x), y)
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
            return loss.item()

        row = timed_loop(a, step)
        result(a, row, processes=procs, stages=2,
               stage_owners=owners, rpc_worker_threads=opts.num_worker_threads)
    rpc.shutdown()


def run_rpc(a):
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(rpc_process, args=(a.rpc_procs, os.path.join(d, "store"), a),
                 nprocs=a.rpc_procs)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=["plain", "pipe", "rpc"], required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--blocks", type=int, default=12)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--split", type=int, default=None,
                   help="index in the flat layer list (flatten, stem, blocks..., norm, head) "
                        "where stage 1 starts; default 2 + blocks // 2")
    p.add_argument("--checkpoint", choices=["never", "except_last"], default="never")
    p.add_argument("--rpc-procs", type=int, choices=[2, 3], default=3)
    p.add_argument("--data-batches", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    n = 2 + a.blocks + 2
    if a.split is None:
        a.split = 2 + a.blocks // 2
    if not 1 <= a.split < n:
        p.error(f"--split must be in [1, {n - 1}]")
    if a.steps < 1 or a.warmup < 0 or a.micro_batches < 1 or a.batch < a.micro_batches:
        p.error("need steps >= 1, warmup >= 0, 1 <= micro-batches <= batch")
    torch.set_num_threads(1)
    {"plain": run_plain, "pipe": run_pipe, "rpc": run_rpc}[a.variant](a)


if __name__ == "__main__":
    main()
