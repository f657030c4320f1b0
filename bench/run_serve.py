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

usage: python3 bench/run_serve.py [--reps 3] [--seconds 5] [--clients 32]"""
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
    args = ap.parse_args()
    cores = os.cpu_count()
    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "model.pt")
    make_model(model)
    serve = [os.path.join(B, "shoal-serve"), model, "--port", "0", "--torch-threads", str(cores)]
    rows = {
        "batched": serve,
        "unbatched": serve + ["--max-batch", "1"],
        "naive": [os.path.join(B, "bench", "shoal_naive_serve"), model, "--torch-threads", "1"],
    }
    results = []
    for rep in range(args.reps):
        for name, cmd in rows.items():
            p, host, port = start(cmd)
            try:
                out = subprocess.run([os.path.join(B, "bench", "shoal_serve_load"), host, port,
                                      "--clients", str(args.clients), "--seconds", str(args.seconds)],
                                     check=True, capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                r.update(row=name, rep=rep)
                results.append(r)
                print(json.dumps(r), flush=True)
            finally:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
    with open(os.path.join(ROOT, "bench", "results", "serve.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print("\n| server | throughput (req/s) | p50 (ms) | p99 (ms) | errors |")
    print("|---|---|---|---|---|")
    for name in rows:
        rs = [r for r in results if r["row"] == name]
        med = lambda k: statistics.median(r[k] for r in rs)
        print("| %s | %.0f | %.2f | %.2f | %d |" % (name, med("throughput"), med("p50_ms"),
                                                   med("p99_ms"), sum(r["errors"] for r in rs)))


if __name__ == "__main__":
    main()
