#!/usr/bin/env python3
"""shoal-serve throughput and latency against the naive one-request-one-forward server, in the
same run, same model (--model fashion_cnn, the default, or fashion_mlp: the 784-4096-4096-10 MLP,
20 M parameters), same HTTP library and request JSON:
  batched   shoal-serve, dynamic batching (--max-batch 64, --batch-window-us 2000)
  unbatched shoal-serve --max-batch 1 (the queue and workers, no batching)
  naive     build/bench/shoal_naive_serve: the forward on the HTTP thread, one per request
Load: build/bench/shoal_serve_load, C closed-loop keep-alive clients on loopback, one image per
request, 1 s warm-up then S s measured. Medians of --reps runs per row. The load average is
printed (and kept in the jsonl) at the start and the end: other work on the host shows there.
Writes bench/results/serve.jsonl and prints a table (bench/results/serve.md is written by hand
from it, with what limits the result).

usage: python3 bench/run_serve.py [--reps 3] [--seconds 5] [--clients 32] [--workers 1]
       [--torch-threads N] [--no-mkldnn] [--rows batched,unbatched,naive] [--out serve.jsonl]
       [--model fashion_cnn|fashion_mlp]"""
import argparse, json, os, re, signal, statistics, subprocess, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = os.path.join(ROOT, "build")


# The MLP as PyTorch writes it: the state_dict names of train/fashion_mlp.h.
MLP = """
class FashionMlp(torch.nn.Module):
    def __init__(self, hidden=4096):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.fc3 = torch.nn.Linear(hidden, 10)
    def forward(self, x):
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc3(torch.relu(self.fc2(x)))
"""


def model_code(model):
    # Python that defines `Model` (the served architecture) after `import torch, sys`.
    if model == "fashion_mlp":
        return MLP + "Model = FashionMlp\n"
    return ("sys.path.insert(0, '%s/tests')\nfrom export_check import FashionCnn\n"
            "Model = FashionCnn\n" % ROOT)


def make_model(path, model):
    # A file of the architecture the server loads (seeded weights: any weights time alike).
    code = ("import torch, sys\n" + model_code(model) +
            "torch.manual_seed(0)\nm = Model()\ntorch.save(dict(m.state_dict()), '%s.tmp')\n" % path)
    subprocess.run(["/usr/bin/python3", "-c", code], check=True)
    # Python's torch.save of a state_dict is a pickled dict: what shoal-export writes too.
    os.rename(path + ".tmp", path)


def forward_cost(model):
    # The limit batching works against: the forward's time per instance by batch size, with and
    # without oneDNN (one thread, the same libtorch build through Python). The MLP's products
    # are BLAS calls either way.
    code = "import sys, time, torch\n" + model_code(model) + """
torch.set_num_threads(1)
m = Model().eval()
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
        out['mkldnn %s batch %d' % (mk, b)] = round((time.perf_counter() - t) / 10 / b * 1e3, 3)
print(out)
"""
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
    ap.add_argument("--model", default="fashion_cnn", choices=["fashion_cnn", "fashion_mlp"])
    args = ap.parse_args()
    cores = os.cpu_count()
    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "model.pt")
    make_model(model, args.model)
    load_start = os.getloadavg()
    print("load average at the start: %.2f %.2f %.2f" % load_start, flush=True)
    threads = args.torch_threads or max(1, cores // args.workers)
    serve = [os.path.join(B, "shoal-serve"), model, "--port", "0", "--workers", str(args.workers),
             "--torch-threads", str(threads), "--model", args.model]
    naive = [os.path.join(B, "bench", "shoal_naive_serve"), model, "--torch-threads", "1",
             "--model", args.model]
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
                r.update(row=name, rep=rep, model=args.model, loadavg=os.getloadavg()[0], cmd=" ".join(os.path.basename(c) for c in cmd[:1]) + " " + " ".join(cmd[2:]))
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
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())
    print("forward ms per instance by batch size (1 thread):", forward_cost(args.model))
    print("\n| server | throughput (req/s) | p50 (ms) | p99 (ms) | errors |")
    print("|---|---|---|---|---|")
    for name in rows:
        rs = [r for r in results if r["row"] == name]
        med = lambda k: statistics.median(r[k] for r in rs)
        print("| %s | %.0f | %.2f | %.2f | %d |" % (name, med("throughput"), med("p50_ms"),
                                                   med("p99_ms"), sum(r["errors"] for r in rs)))


if __name__ == "__main__":
    main()
