#!/usr/bin/python3
"""The DDP benchmark's PyTorch peer: the same CNNs (--model fashion: train/fashion_cnn.h; small:
train/fashion_cnn.h, smallCnn()), data, batch per process, optimizer and learning-rate schedule as
bench/plain_train.cpp, trained with PyTorch's own DistributedDataParallel (gloo backend), one
intra-op thread per process. Prints one JSON line per epoch from rank 0: samples/s over all
processes, epoch seconds, test accuracy.

usage: /usr/bin/python3 bench/pytorch_ddp_train.py --procs N [--epochs E] [--batch B]
       [--model fashion|small] [--steps S (per epoch and process; 0 = the whole epoch)]
(Debian's python3-torch lives under /usr/bin/python3.)"""
import argparse, gzip, json, math, os, struct, tempfile, time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(prefix):
    with gzip.open(f"{DATA}/{prefix}-images-idx3-ubyte.gz") as f:
        _, n, h, w = struct.unpack(">IIII", f.read(16))
        images = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, 1, h, w)
    with gzip.open(f"{DATA}/{prefix}-labels-idx1-ubyte.gz") as f:
        struct.unpack(">II", f.read(8))
        labels = np.frombuffer(f.read(), dtype=np.uint8)
    x = (torch.from_numpy(images.copy()).float() / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.copy()).long()


class FashionCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)
        self.dropout = nn.Dropout(0.25)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.dropout(F.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)


class SmallCnn(FashionCnn):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)
        self.dropout = nn.Dropout(0.25)


def worker(rank, procs, store_file, args):
    torch.set_num_threads(1)
    # A file store: no port to pick (gloo's own listeners take ports the OS chooses).
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                            world_size=procs)
    torch.manual_seed(args.seed)
    xtrain, ytrain = read_idx("train")
    xtest, ytest = read_idx("t10k")
    model = nn.parallel.DistributedDataParallel(
        SmallCnn() if args.model == "small" else FashionCnn())
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(len(ytrain)), num_replicas=procs, rank=rank, shuffle=True, seed=args.seed)
    steps = math.ceil(len(sampler) / args.batch)
    if args.steps > 0:
        steps = min(steps, args.steps)
    total = steps * args.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)))
        dist.barrier()
        t0 = time.perf_counter()
        samples = 0
        for b in range(steps):
            idx = order[b * args.batch:(b + 1) * args.batch]
            samples += len(idx)
            opt.zero_grad()
            loss = F.cross_entropy(model(xtrain[idx]), ytrain[idx])
            loss.backward()
            opt.step()
            sched.step()
        dist.barrier()
        seconds = time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            correct = torch.tensor(0)
            mine = torch.arange(rank, len(ytest), procs)
            for at in range(0, len(mine), 250):
                i = mine[at:at + 250]
                correct += (model(xtest[i]).argmax(1) == ytest[i]).sum()
            dist.all_reduce(correct)
        model.train()
        if rank == 0:
            print(json.dumps({"epoch": epoch + 1, "ranks": procs, "model": args.model,
                              "epoch_seconds": seconds,
                              "samples_per_second": samples * procs / seconds,
                              "test_accuracy": correct.item() / len(ytest)}), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model", choices=["fashion", "small"], default="fashion")
    p.add_argument("--steps", type=int, default=0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(args.procs, os.path.join(d, "store"), args), nprocs=args.procs)


if __name__ == "__main__":
    main()
