#!/usr/bin/python3
"""The elastic-recovery benchmark's PyTorch peer (bench/run_elastic.py runs it): what a torchrun
user does to survive a worker's death. torchrun's elastic agent restarts the whole worker group
(every process, not only the dead one) and the script resumes from its last checkpoint on disk.

Trains Fashion-MNIST with an MLP 784-256-256-10 (ReLU) under DistributedDataParallel (gloo), SGD
lr 0.05 momentum 0.9, --batch samples per rank and step, one intra-op thread per process. Data
order follows Shoal's elastic sampler (train/elastic_sampler.h): each epoch is one permutation of
the 60000 training samples (torch.Generator seeded with seed * 1000003 + epoch; not bit-equal to
Shoal's, only as deterministic), consumed from the front: a step at position p in a world of W
gives rank r perm[p + r*B : p + (r+1)*B]; the epoch's last, short step spreads what remains.
The loss is the sum of the cross entropy over the rank's samples times W / (the step's samples
over all ranks), so DDP's average over ranks is the exact mean over the step's samples.

Rank 0 saves model, optimizer, step, epoch and position every --ckpt-every steps to --ckpt
(written to a temporary file and renamed, so a death mid-write leaves the previous checkpoint),
and every rank loads it at start if it exists.

With --kill-rank R --kill-step S, on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0),
rank R prints {"event": "kill", "time": ..., "step": S} and SIGKILLs itself right after step S's
forward pass (before backward; steps count from 1, so S - 1 steps had completed).

At the end rank 0 evaluates the 10000 test images and prints one JSON line:
  impl, steps, restart_count, resumed_step (the step loaded from the checkpoint on this, the last,
  attempt; 0 without one), first_step_after (time.time() when rank 0's first step completed on a
  restarted attempt; null on the first attempt), caught_up (time.time() when a restarted attempt
  completed step S - 1 again, i.e. had redone the lost work; null if none), script_start (before
  `import torch`), attempt_start (start of main()), final_accuracy (fraction), train_seconds (this
  attempt's training loop), step_seconds (median step of this attempt), torch_version.

usage: /usr/bin/python3 -m torch.distributed.run --nnodes=1:1 --nproc_per_node=4 --max_restarts 3
         --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:PORT --redirects 2 --tee 2
         bench/torchrun_elastic.py
         [--steps 240] [--batch 64] [--seed 1] [--ckpt PATH] [--ckpt-every 20]
         [--kill-rank R --kill-step S]
(Debian's python3-torch lives under /usr/bin/python3. torch 1.13's torchrun spells its options
with underscores; the hyphenated forms only came later. Under Python 3.11 it also needs
--redirects 2 --tee 2 (or 1): its defaults, 0, fail to parse; see bench/run_elastic.py.)"""
import time

# Taken before the heavy imports: a restarted worker pays for the interpreter and `import torch`
# again, and that is part of what a restart costs.
SCRIPT_START = time.time()

import argparse, gzip, json, os, signal, statistics, struct

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


def load_split(prefix):
    """Images as float rows of 784 standardized pixels, labels as int64."""
    with gzip.open(f"{DATA}/{prefix}-images-idx3-ubyte.gz") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        assert magic == 2051, f"{prefix}: not an idx3 image file"
        pixels = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, rows * cols)
    with gzip.open(f"{DATA}/{prefix}-labels-idx1-ubyte.gz") as f:
        magic, m = struct.unpack(">II", f.read(8))
        assert magic == 2049 and m == n, f"{prefix}: labels do not match the images"
        labels = np.frombuffer(f.read(), dtype=np.uint8)
    x = (torch.from_numpy(pixels.astype(np.float32)) / 255.0 - MEAN) / STD
    return x, torch.from_numpy(labels.astype(np.int64))


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def permutation(size, seed, epoch):
    g = torch.Generator()
    g.manual_seed(seed * 1000003 + epoch)
    return torch.randperm(size, generator=g)


def step_slice(size, position, rank, world, batch):
    """This rank's [lo, hi) of the permutation and the step's sample count over all ranks."""
    remaining = size - position
    if remaining >= batch * world:
        lo = position + rank * batch
        return lo, lo + batch, batch * world
    # The epoch's last step: spread the remainder; a rank may get fewer samples, or none.
    return (position + remaining * rank // world, position + remaining * (rank + 1) // world,
            remaining)


def save_checkpoint(path, model, opt, step, epoch, position):
    # Rename over the old file: a crash during the write must not leave a torn checkpoint.
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                "epoch": epoch, "position": position}, tmp)
    os.replace(tmp, path)


def main():
    attempt_start = time.time()
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ckpt", default="torchrun_elastic.ckpt")
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    a = p.parse_args()

    torch.set_num_threads(1)
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")  # rank, world and master address come from torchrun's env
    rank, world = dist.get_rank(), dist.get_world_size()

    xtrain, ytrain = load_split("train")
    size = len(ytrain)
    torch.manual_seed(a.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    # Every rank reads the checkpoint: the momentum buffers are per rank and DDP only broadcasts
    # parameters. Rank 0 of this attempt cannot be writing it yet (that needs a step, and a step
    # needs every rank), and the agent stopped the previous attempt's writer before restarting.
    done, epoch, position = 0, 0, 0
    if os.path.exists(a.ckpt):
        state = torch.load(a.ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        done, epoch, position = state["step"], state["epoch"], state["position"]
    resumed_step = done

    ddp = nn.parallel.DistributedDataParallel(model)
    kill_here = restart_count == 0 and rank == a.kill_rank
    perm, perm_epoch = None, -1
    first_step_after = caught_up = None
    step_times = []
    loop_start = last = time.time()
    while done < a.steps:
        if perm_epoch != epoch:
            perm, perm_epoch = permutation(size, a.seed, epoch), epoch
        lo, hi, total = step_slice(size, position, rank, world, a.batch)
        idx = perm[lo:hi]
        opt.zero_grad()
        loss = F.cross_entropy(ddp(xtrain[idx]), ytrain[idx], reduction="sum") * world / total
        if kill_here and done + 1 == a.kill_step:
            # Die the hard way (no exception, no cleanup) between forward and backward: the other
            # ranks are about to wait for this one's gradients in the all-reduce.
            print(json.dumps({"event": "kill", "time": time.time(), "step": a.kill_step}),
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        opt.step()
        done += 1
        position += total
        if position == size:
            epoch, position = epoch + 1, 0
        now = time.time()
        step_times.append(now - last)
        last = now
        if restart_count > 0:
            if first_step_after is None:
                first_step_after = now
            if caught_up is None and done >= a.kill_step - 1:
                caught_up = now
        if rank == 0 and a.ckpt_every > 0 and done % a.ckpt_every == 0:
            save_checkpoint(a.ckpt, model, opt, done, epoch, position)
    train_seconds = time.time() - loop_start

    if rank == 0:
        xtest, ytest = load_split("t10k")
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(xtest[i:i + 1000]).argmax(1) == ytest[i:i + 1000]).sum())
                          for i in range(0, len(ytest), 1000))
        print(json.dumps({
            "impl": "torchrun", "steps": a.steps, "restart_count": restart_count,
            "resumed_step": resumed_step, "first_step_after": first_step_after,
            "caught_up": caught_up, "script_start": SCRIPT_START, "attempt_start": attempt_start,
            "final_accuracy": correct / len(ytest), "train_seconds": train_seconds,
            "step_seconds": statistics.median(step_times) if step_times else None,
            "world": world, "torch_version": torch.__version__}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
