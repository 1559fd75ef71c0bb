#!/usr/bin/env python3
"""bench/sparse/fidelity.py (issue 13's fidelity report) on two tiny dumps made by oomb-train: a
small random Llama GGUF (train_data.make_llama), 203 tokens, chunk 40, page 8 (26 pages, chunks
starting mid-page, histories of 0/5/10/15/20 pages):

  - K = 26 (covers every history): fidelity.py compare reports loss difference 0 and cosine 1,
    relative L2 0 for every tensor (those chunks run the dense graphs);
  - K = 2 (mean; quest with sink 1): loss difference != 0 and cosine < 1 overall and for the
    worst tensor, all values finite; the table has one row per run;
  - curves: a held-out loss table from a short oomb-train run;
  - bad input: a file that is not a dump, and dumps of different models, exit 1 with a message.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0: all passed; 1: a failure;
77 (skip, with a SKIPPED line): a tool or Python package missing.
"""
import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, SRC, Checks, make_bin, make_llama, need_tools, run_tool, skip  # noqa: E402

try:
    import numpy as np
    from safetensors.numpy import save_file
    import gguf  # noqa: F401  (make_llama)
except ImportError as e:
    skip(f"{e} (needs numpy, safetensors and gguf)")
TRAIN = os.path.join(BIN, "oomb-train")
need_tools(TRAIN)
FID = [sys.executable, os.path.join(SRC, "bench", "sparse", "fidelity.py")]

checks = Checks()
check = checks.check


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-fidelity-") as tmp:
        model = os.path.join(tmp, "llama.gguf")
        make_llama(model)
        ids = os.path.join(tmp, "ids.safetensors")
        rng = np.random.default_rng(7)
        save_file({"input_ids": rng.integers(0, 512, size=203, dtype=np.int32)}, ids)
        base = [TRAIN, "-m", model, "--tokens", ids, "--chunk", "40", "--page", "8", "--device", "cpu", "--threads", "2"]
        dumps = {}
        for name, extra in (("dense", []), ("k26", ["--sparse-pages", "26"]), ("k2", ["--sparse-pages", "2"]),
                            ("k2-quest-sink1", ["--sparse-pages", "2", "--sparse-score", "quest", "--sparse-sink", "1"])):
            path = os.path.join(tmp, f"{name}.safetensors")
            rc, out, err = run_tool(base + ["--dump-grads", path] + extra)
            check(rc == 0, f"oomb-train --dump-grads {name}: exit {rc} {err.strip()[-300:]}")
            dumps[name] = path
        jl = os.path.join(tmp, "runs.jsonl")
        for name in ("k26", "k2", "k2-quest-sink1"):
            rc, out, err = run_tool(FID + ["compare", dumps["dense"], dumps[name], "--tag", name, "--jsonl", jl, "--all"])
            check(rc == 0 and "cosine" in out, f"fidelity.py compare {name}: exit {rc} {err.strip()[-300:]}")
            print(out.strip())
        rows = {}
        if os.path.isfile(jl):
            for line in open(jl):
                r = json.loads(line)
                rows[r["tag"]] = r
        check(sorted(rows) == ["k2", "k2-quest-sink1", "k26"], f"one JSON line per compared run: {sorted(rows)}")
        if "k26" in rows:
            r = rows["k26"]
            check(r["dloss"] == 0.0 and r["cos_all"] == 1.0 and r["cos_min"] == 1.0 and r["rel_l2_max"] == 0.0,
                  f"K 26 covers every history: loss difference {r['dloss']}, cosine {r['cos_all']} (min {r['cos_min']}), "
                  f"relative L2 max {r['rel_l2_max']}: exactly 0 / 1 / 1 / 0")
            check(r["n_tensors"] == 2 * 9 + 3, f"every gradient tensor compared: {r['n_tensors']} of 21")
        for name in ("k2", "k2-quest-sink1"):
            if name not in rows:
                continue
            r = rows[name]
            finite = all(math.isfinite(r[k]) for k in ("dloss", "cos_all", "rel_l2_all", "cos_min", "rel_l2_max"))
            check(finite and r["dloss"] != 0 and r["cos_all"] < 1 - 1e-7 and r["cos_min"] < 1 - 1e-7 and r["rel_l2_all"] > 1e-5,
                  f"{name}: loss difference {r['dloss']:+.3e} != 0, cosine {r['cos_all']:.7f} < 1 (min {r['cos_min']:.7f}), "
                  f"relative L2 {r['rel_l2_all']:.2e} > 0")
            check(r["worst"] and r["worst"][0][1] == r["cos_min"], f"{name}: the worst tensor listed first ({r['worst'][:1]})")
        md = os.path.join(tmp, "table.md")
        rc, out, err = run_tool(FID + ["table", jl, "--out", md])
        table = open(md).read() if os.path.isfile(md) else ""
        check(rc == 0 and table.count("\n| k") == 3 and "| k26 | " in table, f"fidelity.py table: exit {rc}, three rows:\n{table}{err}")

        # curves: held-out loss of a short run (the learnable id stream of the CLI tests)
        data = os.path.join(tmp, "data.bin")
        make_bin(data, 4000, 512, seed=2)
        run_dir = os.path.join(tmp, "run")
        rc, out, err = run_tool([TRAIN, "-m", model, "--data-bin", data, "--ctx", "64", "--chunk", "32", "--page", "8", "--steps", "4",
                                 "--lr", "1e-3", "--eval-every", "2", "--eval-seqs", "2", "--save-every", "-1", "--threads", "2",
                                 "--sparse-pages", "2", "-o", run_dir])
        check(rc == 0, f"oomb-train sparse run: exit {rc} {err.strip()[-300:]}")
        rc, out, err = run_tool(FID + ["curves", f"sparse 2={run_dir}/train.jsonl"])
        check(rc == 0 and "| 0 |" in out and "| 2 |" in out and "| 4 |" in out, f"fidelity.py curves: exit {rc}\n{out}{err}")

        # bad input: clear messages, exit 1
        rc, out, err = run_tool(FID + ["compare", dumps["dense"], ids])
        check(rc == 1 and "no 'loss' tensor" in err, f"compare with a non-dump: exit 1 naming it (got {rc}: {err.strip()[-200:]})")
        other = os.path.join(tmp, "other.safetensors")
        save_file({"loss": np.ones(1, np.float32), "grad.x": np.ones(3, np.float32)}, other)
        rc, out, err = run_tool(FID + ["compare", dumps["dense"], other])
        check(rc == 1 and "different gradients" in err, f"compare dumps of different models: exit 1 (got {rc}: {err.strip()[-200:]})")
        rc, out, err = run_tool(FID + ["compare", dumps["dense"], os.path.join(tmp, "missing.safetensors")])
        check(rc == 1 and "no such file" in err, f"compare with a missing file: exit 1 (got {rc}: {err.strip()[-200:]})")
    checks.finish()


if __name__ == "__main__":
    main()
