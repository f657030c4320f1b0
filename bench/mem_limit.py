#!/usr/bin/python3
"""Runs one command as one process under a memory limit of its own, then becomes it (exec: same
pid, so `shoal run` and bench/pytorch_zero.py see their rank exit or be killed). For the
largest-model experiment of bench/run_zero.py, where every rank gets the same budget.

  --mechanism cgroup  a new memory cgroup, a child of this process's own (cgroup v2:
                      memory.max and memory.swap.max = 0; v1: memory.limit_in_bytes and, where
                      the kernel accounts swap, memory.memsw.limit_in_bytes), named
                      <--cgroup-parent>/p<pid>; the process moves into it before exec. Over the
                      limit the kernel's OOM killer kills it (SIGKILL). Counts what the kernel
                      charges the cgroup: anonymous memory and page cache it brings in (not the
                      shared libraries' pages already cached by others), so not exactly RSS.
                      Needs root (or a delegated cgroup); the caller removes the empty folders.
  --mechanism rlimit  RLIMIT_AS (address space): an allocation past it fails (std::bad_alloc,
                      libtorch's "can't allocate memory", Python's MemoryError). Counts
                      reserved address space, not memory used: thread stacks, glibc's per-thread
                      arenas and libraries' mappings count although untouched (a Shoal rank of
                      zero_train with a tiny model fails at 600 MiB, runs at 1200 MiB, with a
                      188 MiB RSS). Worse, OpenBLAS's buffer thread retries its failed 128 MiB
                      mmap forever and exit() then waits for it (blas_shutdown joins the thread):
                      a rank that ran out of address space HANGS instead of exiting, so only the
                      caller's timeout ends the run. Use cgroup where it is available.

usage: mem_limit.py --bytes B --mechanism cgroup|rlimit [--cgroup-parent NAME] -- COMMAND ...
       mem_limit.py --probe      prints which mechanisms this machine allows (exit 0)"""
import argparse, os, resource, sys

CGROOT = "/sys/fs/cgroup"


def own_memory_cgroup():
    """(folder of this process's memory cgroup, 'v1' or 'v2'), or (None, why)."""
    v2, v1 = None, None
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and controllers == "":
                v2 = path
            elif "memory" in controllers.split(","):
                v1 = path
    if v1 is not None and os.path.exists(os.path.join(CGROOT, "memory", "memory.limit_in_bytes")):
        return os.path.join(CGROOT, "memory") + v1, "v1"
    if v2 is not None:
        # The unified hierarchy: /sys/fs/cgroup itself, or /sys/fs/cgroup/unified (hybrid).
        for root in (CGROOT, os.path.join(CGROOT, "unified")):
            ctl = os.path.join(root + v2, "cgroup.controllers")
            if os.path.exists(ctl) and "memory" in open(ctl).read().split():
                return root + v2, "v2"
        return None, "cgroup v2 without the memory controller"
    return None, "no memory cgroup"


def make_cgroup(parent_name, name, limit):
    base, version = own_memory_cgroup()
    if base is None:
        raise OSError(version)
    parent = os.path.join(base, parent_name)
    os.makedirs(parent, exist_ok=True)
    if version == "v2":
        # Children of a v2 cgroup get the memory controller only if the parent enables it.
        with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
            f.write("+memory")
    d = os.path.join(parent, name)
    os.makedirs(d, exist_ok=True)
    if version == "v2":
        with open(os.path.join(d, "memory.max"), "w") as f:
            f.write(str(limit))
        if os.path.exists(os.path.join(d, "memory.swap.max")):
            with open(os.path.join(d, "memory.swap.max"), "w") as f:
                f.write("0")
    else:
        with open(os.path.join(d, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        sw = os.path.join(d, "memory.memsw.limit_in_bytes")
        if os.path.exists(sw):
            try:
                with open(sw, "w") as f:
                    f.write(str(limit))
            except OSError:
                pass  # swap accounting off: no swap to limit
    return d


def cgroup_parent_folder(parent_name):
    base, _ = own_memory_cgroup()
    return None if base is None else os.path.join(base, parent_name)


def remove_cgroups(parent_name):
    """Removes <parent>/p* and <parent> once their processes are gone (best effort)."""
    parent = cgroup_parent_folder(parent_name)
    if parent is None or not os.path.isdir(parent):
        return
    for e in os.listdir(parent):
        p = os.path.join(parent, e)
        if os.path.isdir(p):
            try:
                os.rmdir(p)
            except OSError:
                pass
    try:
        os.rmdir(parent)
    except OSError:
        pass


def probe():
    ok = []
    try:
        d = make_cgroup(f"shoal-mem-probe-{os.getpid()}", "p0", 1 << 30)
        ok.append(f"cgroup ({own_memory_cgroup()[1]}, {d})")
        remove_cgroups(f"shoal-mem-probe-{os.getpid()}")
    except OSError as e:
        print(f"cgroup: not available ({e})")
    ok.append("rlimit")
    print("available: " + ", ".join(ok))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", type=int)
    p.add_argument("--mechanism", choices=["cgroup", "rlimit"], default="cgroup")
    p.add_argument("--cgroup-parent", default=f"shoal-mem-limit-{os.getppid()}")
    p.add_argument("--probe", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if a.probe:
        probe()
        return
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd or not a.bytes:
        p.error("--bytes and a command are required")
    if a.mechanism == "cgroup":
        d = make_cgroup(a.cgroup_parent, f"p{os.getpid()}", a.bytes)
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    else:
        resource.setrlimit(resource.RLIMIT_AS, (a.bytes, a.bytes))
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
