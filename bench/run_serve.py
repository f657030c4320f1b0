#!/usr/bin/env python3
"""shoal-serve throughput and latency against the naive one-request-one-forward server, in the
same run, same model (FashionCnn), same HTTP library and request JSON:
  batched   shoal-serve, dynamic batching (--max-batch 64, --batch-window-us 2000)
  unbatched shoal-serve --max-batch 1 (the queue and workers, no batching)
  naive     build/bench/shoal_naive_serve: the forward on the HTTP thread, one per request
Load: build/bench/shoal_serve_load, C closed-loop keep-alive clients on loopback, one image per
request, 1 s warm-up then S s measured. Medians of --reps runs per row.
Writes bench/results/serve.jsonl and prints a table (bench/results/serve.md is written by hand
from it, with what limits the result).

usage: python3 bench/run_serve.py [--reps 3] [--seconds 5] [--clients 32] [--workers 1]
       [--torch-threads N] [--no-mkldnn] [--rows batched,unbatched,naive] [--out serve.jsonl]"""
import argparse, json, os, re, signal, statistics, subprocess, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = os.path.join(ROOT, "build")


def make_model(path):
    # A FashionCnn file the server loads: the export test's model would do; any weights time alike.
    code = ("import torch,sys\nsys.path.insert(0,'%s/tests')\nfrom export_check import FashionCnn\n"
            "torch.manual_seed(0)\nm=FashionCnn()\ntorch.save(dict(m.state_dict()), '%s.tmp')\n" % (ROOT, path))
    subprocess.run(["/usr/bin/python3", "-c", code], check=True)
    # Python's torch.save of a state_dict is a pickled dict: what shoal-export writes too.
    os.rename(path + ".tmp", path)


def forward_cost():
    # The limit batching works against: the forward's time per instance by batch size, with and
    # without oneDNN (one thread, the same libtorch build through Python).
    code = """
import sys, time, torch
sys.path.insert(0, '%s/tests')
from export_check import FashionCnn
torch.set_num_threads(1)
m = FashionCnn().eval()
out = {}
for mk in (True, False):
    torch.backends.mkldnn.enabled = mk
    for b in (1, 2, 4, 16, 64):
        x = torch.randn(b, 1, 28, 28)
        with torch.no_grad():
            for _ in range(3):
                m(x)
            t = time.perf_counter()
            for _ in range(10):
                m(x)
        out['mkldnn %%s batch %%d' %% (mk, b)] = round((time.perf_counter() - t) / 10 / b * 1e3, 3)
print(out)
""" % ROOT
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    return subprocess.run(["/usr/bin/python3", "-c", code], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


def start(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        m = re.search(r"at http://([0-9.]+):([0-9]+)/", line)
        if m:
            return p, m.group(1), m.group(2)
    raise RuntimeError("server did not start: %s" % " ".join(cmd))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--torch-threads", type=int, default=0, help="per forward; 0: cores / workers")
    ap.add_argument("--rows", default="batched,unbatched,naive")
    ap.add_argument("--no-mkldnn", action="store_true",
                    help="native convolutions in every server (tools/serve/served_model.h)")
    ap.add_argument("--out", default="serve.jsonl")
    args = ap.parse_args()
    cores = os.cpu_count()
    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "model.pt")
    make_model(model)
    threads = args.torch_threads or max(1, cores // args.workers)
    serve = [os.path.join(B, "shoal-serve"), model, "--port", "0", "--workers", str(args.workers),
             "--torch-threads", str(threads)]
    naive = [os.path.join(B, "bench", "shoal_naive_serve"), model, "--torch-threads", "1"]
    if args.no_mkldnn:
        serve.append("--no-mkldnn")
        naive += ["--mkldnn", "off"]
    rows = {
        "batched": serve,
        "unbatched": serve + ["--max-batch", "1"],
        "naive": naive,
    }
    rows = {k: v for k, v in rows.items() if k in args.rows.split(",")}
    results = []
    for rep in range(args.reps):
        for name, cmd in rows.items():
            p, host, port = start(cmd)
            try:
                out = subprocess.run([os.path.join(B, "bench", "shoal_serve_load"), host, port,
                                      "--clients", str(args.clients), "--seconds", str(args.seconds)],
                                     check=True, capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                r.update(row=name, rep=rep, cmd=" ".join(os.path.basename(c) for c in cmd[:1]) + " " + " ".join(cmd[2:]))
                results.append(r)
                print(json.dumps(r), flush=True)
            finally:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
    with open(os.path.join(ROOT, "bench", "results", args.out), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print("forward ms per instance by batch size (1 thread):", forward_cost())
    print("\n| server | throughput (req/s) | p50 (ms) | p99 (ms) | errors |")
    print("|---|---|---|---|---|")
    for name in rows:
        rs = [r for r in results if r["row"] == name]
        med = lambda k: statistics.median(r[k] for r in rs)
        print("| %s | %.0f | %.2f | %.2f | %d |" % (name, med("throughput"), med("p50_ms"),
                                                   med("p99_ms"), sum(r["errors"] for r in rs)))


if __name__ == "__main__":
    main()
