#!/usr/bin/python3
"""Renders a pipeline trace (Chrome trace format) as a PNG timeline: one row per rank (pid),
forward and backward boxes in different colours (a lighter shade for a stage's second model
chunk under the interleaved schedule), each labelled by its micro-batch where it is wide enough,
other complete events (send/recv, optimizer, ...) as thin grey bars at the bottom of the row, and
the row's idle time as the grey background between boxes.

Input: {"traceEvents": [{"name", "ph": "X", "ts" (us), "dur" (us), "pid" (= rank), "tid",
"cat", "args"}, ...]} or a bare list of events; "B"/"E" pairs are paired per (pid, tid), "M"
process_name metadata names the rows. An event is a forward or a backward when its args.kind /
args.phase, its cat or its name starts with forward/fwd or backward/bwd, or its name is "F<n>" /
"B<n>" ("F3", "B3.1"). The micro-batch is args.mb / args.micro_batch / args.microbatch, or the
first number in the name; the model chunk is args.chunk (or the number after the dot in "F3.1").
args.step, when the events carry it, lets --step choose one training step.

usage: /usr/bin/python3 bench/trace_png.py trace.json out.png [--title T] [--step N|last]
       [--window START_MS END_MS]"""
import argparse, json, re, sys

FWD = ["#4C72B0", "#9DB7E0"]  # chunk 0, chunk 1 (interleaved)
BWD = ["#DD8452", "#F2BE98"]
OTHER, IDLE = "#7F7F7F", "#E9E9E9"


def load_events(path):
    with open(path) as f:
        doc = json.load(f)
    raw = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    names, events, open_ = {}, [], {}
    for e in raw:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "process_name":
            names[e.get("pid", 0)] = (e.get("args") or {}).get("name")
        elif ph == "X" and "ts" in e:
            events.append(dict(e, dur=float(e.get("dur", 0))))
        elif ph == "B" and "ts" in e:
            open_.setdefault((e.get("pid", 0), e.get("tid", 0)), []).append(e)
        elif ph == "E" and "ts" in e:
            stack = open_.get((e.get("pid", 0), e.get("tid", 0)))
            if stack:
                b = stack.pop()
                events.append(dict(b, ph="X", dur=float(e["ts"]) - float(b["ts"]),
                                   args={**(b.get("args") or {}), **(e.get("args") or {})}))
    for e in events:
        e["ts"] = float(e["ts"])
        e.setdefault("pid", 0)
    return events, names


def kind_of(e):
    args = e.get("args") or {}
    name = str(e.get("name", "")).strip().lower()
    for s in (str(args.get("kind", "")), str(args.get("phase", "")), str(e.get("cat", "")), name):
        s = s.strip().lower()
        if s.startswith(("forward", "fwd")):
            return "forward"
        if s.startswith(("backward", "bwd")):
            return "backward"
    m = re.match(r"^([fb])\s*\d", name)
    if m:
        return "forward" if m.group(1) == "f" else "backward"
    return "other"


def micro_batch(e):
    args = e.get("args") or {}
    for k in ("mb", "micro_batch", "microbatch"):
        if k in args:
            return args[k]
    m = re.search(r"\d+", str(e.get("name", "")))
    return int(m.group()) if m else None


def chunk_of(e):
    args = e.get("args") or {}
    if "chunk" in args:
        try:
            return int(args["chunk"])
        except (TypeError, ValueError):
            return 0
    m = re.match(r"^[fb]\s*\d+\.(\d+)", str(e.get("name", "")).strip().lower())
    return int(m.group(1)) if m else 0


def union_length(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def select(events, step=None, window=None):
    """Events of one step (args.step; "last" = the largest) and/or a window in ms from the
    first event. Returns (events, note)."""
    note = ""
    if step is not None:
        steps = sorted({(e.get("args") or {}).get("step") for e in events} - {None})
        if not steps:
            note = "no args.step in the trace: every step shown"
        else:
            want = steps[-1] if step == "last" else int(step)
            events = [e for e in events if (e.get("args") or {}).get("step") == want]
            note = f"step {want}"
    if window is not None and events:
        t0 = min(e["ts"] for e in events)
        lo, hi = t0 + 1e3 * window[0], t0 + 1e3 * window[1]
        events = [e for e in events if e["ts"] + e["dur"] >= lo and e["ts"] <= hi]
    return events, note


def render(trace, out, title=None, step=None, window=None):
    """Writes the PNG; returns {rank: idle fraction in the picture}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events, names = load_events(trace)
    events, note = select(events, step, window)
    if not events:
        raise SystemExit(f"{trace}: no complete events to draw")
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e["dur"] for e in events)
    span_ms = max((t1 - t0) / 1e3, 1e-9)
    ranks = sorted({e["pid"] for e in events}, key=lambda p: (str(type(p)), p))
    fig_w = 14
    fig, ax = plt.subplots(figsize=(fig_w, 0.9 * len(ranks) + 1.4))
    px_per_ms = (fig_w * 0.8 * fig.dpi) / span_ms
    idle = {}
    for row, rank in enumerate(ranks):
        y = len(ranks) - 1 - row  # rank 0 on top
        mine = [e for e in events if e["pid"] == rank]
        compute = [e for e in mine if kind_of(e) != "other"]
        ax.broken_barh([(0, span_ms)], (y - 0.4, 0.8), facecolors=IDLE)
        busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in compute])
        idle[rank] = 1 - busy / (t1 - t0) if t1 > t0 else 0.0
        for e in compute:
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            palette = FWD if kind_of(e) == "forward" else BWD
            ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=palette[min(chunk_of(e), 1)],
                           edgecolors="white", linewidth=0.5)
            mb = micro_batch(e)
            if mb is not None and w * px_per_ms >= 9:
                ax.text(x + w / 2, y, str(mb), ha="center", va="center", fontsize=7,
                        color="black" if chunk_of(e) else "white")
        others = [((e["ts"] - t0) / 1e3, max(e["dur"] / 1e3, span_ms / 2000))
                  for e in mine if kind_of(e) == "other"]
        if others:
            ax.broken_barh(others, (y - 0.4, 0.12), facecolors=OTHER)
    labels = []
    for rank in ranks:
        label = names.get(rank) or f"rank {rank}"
        labels.append(f"{label}\nidle {100 * idle[rank]:.1f}%")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels(list(reversed(labels)), fontsize=8)
    ax.set_ylim(-0.6, len(ranks) - 0.4)
    ax.set_xlim(0, span_ms)
    ax.set_xlabel("ms from the first event shown")
    legend = [Patch(color=FWD[0], label="forward"), Patch(color=BWD[0], label="backward")]
    if any(chunk_of(e) for e in events):
        legend += [Patch(color=FWD[1], label="forward, chunk 1"),
                   Patch(color=BWD[1], label="backward, chunk 1")]
    legend += [Patch(color=OTHER, label="other (comm, optimizer)"), Patch(color=IDLE, label="idle")]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.02 * len(ranks)),
              ncol=len(legend), fontsize=8, frameon=False)
    heading = title or trace
    if note:
        heading += f" ({note})"
    ax.set_title(heading + "   box label: micro-batch", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return idle


def main():
    p = argparse.ArgumentParser(description="Chrome-trace pipeline timeline -> PNG")
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--title")
    p.add_argument("--step", help="a training step (args.step) to show alone, or 'last'")
    p.add_argument("--window", nargs=2, type=float, metavar=("START_MS", "END_MS"))
    a = p.parse_args()
    idle = render(a.trace, a.out, a.title, a.step, a.window)
    print(json.dumps({"png": a.out, "idle_in_picture": {str(k): round(v, 4)
                                                         for k, v in idle.items()}}))


if __name__ == "__main__":
    sys.exit(main())
