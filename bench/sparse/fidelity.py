#!/usr/bin/env python3
"""Sparse-vs-dense fidelity of page-level top-K attention (issue 13, bench/sparse/RESULTS.md).

Design: the gradient dumps of a real model are large (SmolLM2-135M: 540 MB of f32 each) and do not
come back from the GPU machine, so this script summarises them where they are made: `compare`
reads one tensor at a time (float64 sums) and appends one small JSON line per run; `table` and
`curves` turn those lines and oomb-train's train.jsonl files into markdown, anywhere.

  fidelity.py compare DENSE.safetensors SPARSE.safetensors [--tag T] [--jsonl RUNS.jsonl] [--worst N]
      DENSE / SPARSE: `oomb-train --dump-grads` files (a `loss` [1] f32 tensor and `grad.NAME` tensors).
      Prints the loss difference (sparse - dense, nats/token), the cosine and relative L2
      (|g_s - g_d| / |g_d|) of every gradient tensor and of all of them together, and the N worst
      tensors by cosine. --jsonl appends {"tag", "loss_dense", "loss_sparse", "dloss", "cos_all",
      "rel_l2_all", "cos_min", "cos_median", "rel_l2_max", "n_tensors", "worst": [[name, cos, rel_l2]...]}.
      Errors (exit 1): a file missing, no `loss`, different tensor names or shapes.
  fidelity.py table RUNS.jsonl... [--out TABLE.md]
      One markdown row per JSON line (in file order): the fidelity table.
  fidelity.py curves LABEL=OUT/train.jsonl... [--out CURVES.md]
      The held-out loss (eval_loss) of each run by step, one column per run, and each run's last
      train loss and tokens/s.
"""
import argparse
import json
import math
import os
import sys


def fail(msg):
    print(f"fidelity.py: {msg}", file=sys.stderr)
    sys.exit(1)


def open_dump(path):
    try:
        from safetensors import safe_open
    except ImportError as e:
        fail(f"{e} (needs numpy and safetensors)")
    if not os.path.isfile(path):
        fail(f"{path}: no such file")
    f = safe_open(path, "np")
    if "loss" not in f.keys():
        fail(f"{path}: no 'loss' tensor (not an oomb-train --dump-grads file?)")
    return f


def cosine(dot, na2, nb2):
    """cos of two vectors from their dot product and squared norms; two zero vectors are equal (1)."""
    if na2 == 0 and nb2 == 0:
        return 1.0
    if na2 == 0 or nb2 == 0:
        return 0.0
    return max(-1.0, min(1.0, dot / math.sqrt(na2 * nb2)))


def compare(dense_path, sparse_path):
    """The comparison as a dict (see the module doc); per-tensor rows in r["tensors"]."""
    import numpy as np

    fd, fs = open_dump(dense_path), open_dump(sparse_path)
    kd = sorted(k for k in fd.keys() if k.startswith("grad."))
    ks = sorted(k for k in fs.keys() if k.startswith("grad."))
    if kd != ks:
        fail(f"{dense_path} and {sparse_path} hold different gradients: only in dense {sorted(set(kd) - set(ks))[:5]}, "
             f"only in sparse {sorted(set(ks) - set(kd))[:5]}")
    if not kd:
        fail(f"{dense_path}: no grad.* tensors")
    ld, ls = float(fd.get_tensor("loss")[0]), float(fs.get_tensor("loss")[0])
    rows, tot = [], [0.0, 0.0, 0.0, 0.0]  # dot, |d|^2, |s|^2, |s-d|^2
    for k in kd:
        d = fd.get_tensor(k).astype(np.float64).ravel()
        s = fs.get_tensor(k).astype(np.float64).ravel()
        if d.shape != s.shape:
            fail(f"{k}: {d.size} elements in dense, {s.size} in sparse")
        if not (np.isfinite(d).all() and np.isfinite(s).all()):
            fail(f"{k}: non-finite gradient values")
        dot, nd, ns, ne = float(d @ s), float(d @ d), float(s @ s), float(((s - d) ** 2).sum())
        for i, v in enumerate((dot, nd, ns, ne)):
            tot[i] += v
        rel = math.sqrt(ne / nd) if nd > 0 else (0.0 if ne == 0 else math.inf)
        rows.append((k[len("grad."):], cosine(dot, nd, ns), rel, d.size))
    coss = sorted(r[1] for r in rows)
    return {
        "loss_dense": ld, "loss_sparse": ls, "dloss": ls - ld,
        "cos_all": cosine(tot[0], tot[1], tot[2]),
        "rel_l2_all": math.sqrt(tot[3] / tot[1]) if tot[1] > 0 else (0.0 if tot[3] == 0 else math.inf),
        "cos_min": coss[0], "cos_median": coss[len(coss) // 2],
        "rel_l2_max": max(r[2] for r in rows), "n_tensors": len(rows), "n_params": sum(r[3] for r in rows),
        "tensors": rows,
    }


def cmd_compare(a):
    r = compare(a.dense, a.sparse)
    rows = r.pop("tensors")
    print(f"loss dense {r['loss_dense']:.6f}  sparse {r['loss_sparse']:.6f}  difference {r['dloss']:+.3e} nats/token")
    print(f"all {r['n_tensors']} gradient tensors ({r['n_params']} values): cosine {r['cos_all']:.6f}, "
          f"relative L2 {r['rel_l2_all']:.3e}; per tensor: cosine min {r['cos_min']:.6f}, median {r['cos_median']:.6f}, "
          f"relative L2 max {r['rel_l2_max']:.3e}")
    if a.all:
        for name, c, rel, n in rows:
            print(f"  {name:40s} {n:>10d}  cos {c:.6f}  rel L2 {rel:.3e}")
    worst = sorted(rows, key=lambda x: x[1])[:a.worst]
    print(f"worst {len(worst)} by cosine: " + ", ".join(f"{n} {c:.4f} ({rel:.2e})" for n, c, rel, _ in worst))
    r["worst"] = [[n, c, rel] for n, c, rel, _ in worst]
    r["tag"] = a.tag or os.path.basename(a.sparse)
    if a.jsonl:
        with open(a.jsonl, "a") as f:
            f.write(json.dumps(r) + "\n")


def read_jsonl(path):
    if not os.path.isfile(path):
        fail(f"{path}: no such file")
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    fail(f"{path}:{i + 1}: {e}")
    return out


def write(text, out):
    if out:
        with open(out, "w") as f:
            f.write(text)
    print(text, end="")


def cmd_table(a):
    lines = ["| run | loss dense | loss sparse | difference | cosine (all) | rel. L2 (all) | cosine min | cosine median | worst tensor |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for p in a.runs:
        for r in read_jsonl(p):
            w = r["worst"][0] if r.get("worst") else ["-", float("nan"), float("nan")]
            lines.append(f"| {r['tag']} | {r['loss_dense']:.5f} | {r['loss_sparse']:.5f} | {r['dloss']:+.2e} | {r['cos_all']:.6f} | "
                         f"{r['rel_l2_all']:.2e} | {r['cos_min']:.6f} | {r['cos_median']:.6f} | {w[0]} ({w[1]:.4f}) |")
    write("\n".join(lines) + "\n", a.out)


def cmd_curves(a):
    runs = []
    for spec in a.runs:
        if "=" not in spec:
            fail(f"'{spec}': give LABEL=OUT/train.jsonl")
        label, path = spec.split("=", 1)
        ev, last = {}, None
        for j in read_jsonl(path):
            if j.get("eval_loss") is not None:
                ev[j["step"]] = j["eval_loss"]
            if j.get("loss") is not None:
                last = j
        runs.append((label, ev, last))
    steps = sorted(set().union(*[set(ev) for _, ev, _ in runs]))
    if not steps:
        fail("no eval_loss lines in " + ", ".join(a.runs))
    lines = ["| step | " + " | ".join(f"{l}: held-out loss" for l, _, _ in runs) + " |", "|---:|" + "---:|" * len(runs)]
    for s in steps:
        lines.append(f"| {s} | " + " | ".join(f"{ev[s]:.4f}" if s in ev else "-" for _, ev, _ in runs) + " |")
    tail = []
    for label, _, last in runs:
        if last:
            tps = last.get("tok_per_s", last.get("tokens_per_s"))
            tail.append(f"{label}: last train loss {last['loss']:.4f} at step {last['step']}" + (f", {tps:.0f} tok/s" if tps else ""))
    write("\n".join(lines) + "\n\n" + "; ".join(tail) + "\n", a.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="one sparse dump against the dense one")
    c.add_argument("dense"), c.add_argument("sparse")
    c.add_argument("--tag", help="the run's name in the table (default: the sparse file's name)")
    c.add_argument("--jsonl", help="append the summary to this file")
    c.add_argument("--worst", type=int, default=5, help="how many worst tensors to list")
    c.add_argument("--all", action="store_true", help="print every tensor")
    t = sub.add_parser("table", help="markdown table of compare's JSON lines")
    t.add_argument("runs", nargs="+"), t.add_argument("--out")
    u = sub.add_parser("curves", help="markdown table of held-out loss curves")
    u.add_argument("runs", nargs="+"), u.add_argument("--out")
    a = ap.parse_args()
    {"compare": cmd_compare, "table": cmd_table, "curves": cmd_curves}[a.cmd](a)


if __name__ == "__main__":
    main()
