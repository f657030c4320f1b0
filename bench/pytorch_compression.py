#!/usr/bin/python3
"""The compression benchmark's PyTorch peer: bench/compression_train.cpp's model (784 - hidden -
hidden - 10 MLP with ReLUs), data (Fashion-MNIST, standardized as train/idx_dataset.h does),
optimizer (SGD with momentum, constant rate), batch per rank, evaluation protocol and JSON line,
trained with PyTorch's DistributedDataParallel over gloo and one of its communication hooks:
  none                   no hook (gloo's all-reduce of the buckets)
  fp16[,warmup=N]        default_hooks.fp16_compress_hook
  powersgd:R[,warmup=N]  powerSGD_hook.powerSGD_hook, PowerSGDState(matrix_approximation_rank=R,
                         start_powerSGD_iter=N): N plain all-reduce steps first, as Shoal's
                         warm-up (PyTorch requires N >= 2 with its error feedback and warm start);
                         the whole model in one DDP bucket (Note [One bucket for PowerSGD over gloo])
fp16 with a warm-up runs the plain all-reduce for N steps, then the fp16 hook (Shoal's order).

Evaluation: every --eval-every steps (and after the last) each rank classifies its contiguous
share of the 10k test images, the counts are summed with rank 0's vote to stop, and the clock
(training time only) pauses meanwhile: see compression_train.cpp. bytes_per_step is null (gloo
does not count what it sends); link_bytes_per_step is what rank 0's host sent on its network
interfaces (/proc/net/dev, loopback excluded) per step, as compression_train.cpp reports it.

One process per rank, as bench/run_compression.py starts them in the emulated hosts' network
namespaces: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment (GLOO_SOCKET_IFNAME
names the interface gloo uses). Without RANK, --procs N processes are spawned on this machine
(a file store), for trying the script out.

usage: /usr/bin/python3 bench/pytorch_compression.py [--procs N] [--compression SPEC]
       [--target-accuracy 0.78] [--eval-every 5] [--max-seconds 600] [--max-steps 100]
       [--stop-at-target] [--min-steps S]
       [--lr 0.01] [--momentum 0.9] [--seed 1] [--batch 64] [--hidden 3072]"""
import argparse, gzip, json, os, statistics, struct, tempfile, time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(prefix):
    with gzip.open(f"{DATA}/{prefix}-images-idx3-ubyte.gz") as f:
        _, n, h, w = struct.unpack(">IIII", f.read(16))
        images = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, h * w)
    with gzip.open(f"{DATA}/{prefix}-labels-idx1-ubyte.gz") as f:
        struct.unpack(">II", f.read(8))
        labels = np.frombuffer(f.read(), dtype=np.uint8)
    x = (torch.from_numpy(images.copy()).float() / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.copy()).long()


def parse_spec(text):
    """(codec, rank, warmup) from Shoal's spec syntax, for the codecs PyTorch has hooks for."""
    head, *opts = text.split(",")
    warmup = 0
    for o in opts:
        k, _, v = o.partition("=")
        if k != "warmup" or not v.isdigit():
            raise SystemExit(f"pytorch_compression: bad option '{o}' in '{text}' (warmup=N)")
        warmup = int(v)
    codec, _, arg = head.partition(":")
    if codec in ("none", "fp16") and not arg:
        return codec, 0, warmup
    if codec == "powersgd" and arg.isdigit() and int(arg) >= 1:
        return codec, int(arg), warmup
    raise SystemExit(f"pytorch_compression: '{text}': none, fp16 or powersgd:R [,warmup=N]")


def canonical(codec, rank, warmup):
    text = f"powersgd:{rank}" if codec == "powersgd" else codec
    return text + (f",warmup={warmup}" if warmup else "")


def link_bytes_sent():
    total = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, fields = line.partition(":")
            if name.strip() != "lo":
                total += int(fields.split()[8])
    return total


class Fp16AfterWarmup:
    """The plain all-reduce for `warmup` steps, then fp16_compress_hook."""

    def __init__(self, warmup):
        self.warmup, self.calls = warmup, 0

    def __call__(self, state, bucket):
        # Steps are counted by the last bucket of each iteration, as PowerSGD's state does.
        step = self.calls
        if bucket.is_last():
            self.calls += 1
        if step < self.warmup:
            return default_hooks.allreduce_hook(state, bucket)
        return default_hooks.fp16_compress_hook(state, bucket)


def train(rank, world, args):
    torch.set_num_threads(1)
    codec, prank, warmup = parse_spec(args.compression)
    torch.manual_seed(args.seed)
    xtrain, ytrain = read_idx("train")
    xtest, ytest = read_idx("t10k")
    h = args.hidden
    net = nn.Sequential(nn.Linear(784, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    params = sum(p.numel() for p in net.parameters())
    if codec == "powersgd":
        # Note [One bucket for PowerSGD over gloo]: the hook issues its second and third
        # all-reduces from the callbacks of the first, on gloo's threads, so with several buckets
        # the ranks can issue one bucket's P all-reduce and another's plain one in different
        # orders, and gloo aborts (pair.cc: "op.preamble.length <= op.nbytes"). With the whole
        # model in one bucket the order is the same on every rank.
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
        model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=1024)
    else:
        model = nn.parallel.DistributedDataParallel(net)
    if codec == "fp16":
        if warmup:
            model.register_comm_hook(None, Fp16AfterWarmup(warmup))
        else:
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif codec == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=prank,
                                            start_powerSGD_iter=warmup)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(len(ytrain)), num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    per_epoch = (len(sampler) + args.batch - 1) // args.batch
    n = len(ytest)
    lo, hi = n * rank // world, n * (rank + 1) // world

    step_seconds, loss_window, evals = [], [], []
    to_target = steps_to_target = None
    accuracy = test_loss = 0.0
    train_seconds, link, link_at = 0.0, 0, 0
    step, epoch, order = 0, -1, None
    dist.barrier()
    start, link_at = time.perf_counter(), link_bytes_sent()
    stop = False
    while not stop:
        b = step % per_epoch
        if b == 0:
            epoch += 1
            sampler.set_epoch(epoch)
            order = torch.tensor(list(iter(sampler)))
        idx = order[b * args.batch:(b + 1) * args.batch]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(xtrain[idx]), ytrain[idx])
        loss.backward()
        opt.step()
        step_seconds.append(time.perf_counter() - t0)
        loss_window.append(loss.item())
        step += 1
        if step % args.eval_every != 0 and step < args.max_steps and step != args.min_steps:
            continue
        train_seconds += time.perf_counter() - start
        link += link_bytes_sent() - link_at
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for at in range(lo, hi, 1000):
                out = net(xtest[at:min(at + 1000, hi)])
                y = ytest[at:min(at + 1000, hi)]
                sums[0] += (out.argmax(1) == y).sum().item()
                sums[1] += F.cross_entropy(out, y, reduction="sum").item()
        if rank == 0:
            sums[2] = float(step >= args.max_steps or train_seconds >= args.max_seconds)
        dist.all_reduce(sums)
        model.train()
        accuracy, test_loss = sums[0].item() / n, sums[1].item() / n
        evals.append([step, train_seconds, accuracy])
        if to_target is None and accuracy >= args.target_accuracy:
            to_target, steps_to_target = train_seconds, step
        stop = sums[2].item() > 0 or (args.stop_at_target and to_target is not None and
                                      step >= args.min_steps)
        if not stop:
            loss_window = []
            dist.barrier()
            start, link_at = time.perf_counter(), link_bytes_sent()
    if rank == 0:
        steady = step_seconds[min(max(warmup if codec != "none" else 0, 1), len(step_seconds) - 1):]
        print(json.dumps({
            "impl": "pytorch", "spec": canonical(codec, prank, warmup), "ranks": world,
            "params": params, "batch": args.batch, "lr": args.lr, "momentum": args.momentum, "steps": step,
            "median_step_seconds": statistics.median(steady), "bytes_per_step": None,
            "link_bytes_per_step": link / step, "train_seconds": train_seconds,
            "target_accuracy": args.target_accuracy, "seconds_to_target": to_target,
            "steps_to_target": steps_to_target, "final_accuracy": accuracy,
            "final_loss": test_loss, "train_loss": sum(loss_window) / len(loss_window),
            "evals": evals}), flush=True)
    dist.destroy_process_group()


def spawned(rank, world, store_file, args):
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                            world_size=world)
    train(rank, world, args)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, default=4, help="without RANK in the environment")
    p.add_argument("--compression", default="none")
    p.add_argument("--target-accuracy", type=float, default=0.78)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=600)
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--stop-at-target", action="store_true")
    p.add_argument("--min-steps", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=3072)
    args = p.parse_args()
    parse_spec(args.compression)  # a bad spec fails here, before any process starts
    if "RANK" in os.environ:
        dist.init_process_group("gloo", init_method="env://")
        train(dist.get_rank(), dist.get_world_size(), args)
        return
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(spawned, args=(args.procs, os.path.join(d, "store"), args), nprocs=args.procs)


if __name__ == "__main__":
    main()
