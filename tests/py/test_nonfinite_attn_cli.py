#!/usr/bin/env python3
"""Non-finite weights through the attention, on the CPU backend (review s5b finding): a NaN in one
layer's K projection (qwen2-mini, 5 elements of blk.1.attn_k.weight's first row) makes every key of
that KV head NaN. Before the fix the CPU paged attention dropped NaN scores (its lane max skips a
NaN, and a NaN softmax sum was normalised to 0), so each affected attention row came out as a
finite 0: `oomb-eval` printed a finite mean NLL (8.04 vs 8.06 for the clean model) and exit 0, and
`--dump-grads` wrote a finite loss. Now:

  - `oomb-eval` exits 2 with its "mean NLL is not finite" message, dense, with `--sparse-pages 2`,
    and with `--sparse-pages 2 --offload on --gpu-kv-budget 0` (the streamed blocks merged
    through their LSE);
  - `oomb-train --dump-grads` writes a NaN loss (dense and sparse + offload), and a training run
    skips the non-finite steps and stops with exit code 2 after three of them, naming the weight that holds
    the NaN and the input model (not "try a lower --lr"), as does a run that ends on non-finite steps;
  - the clean model still gives a finite NLL with the same options (control).

CTest sets the environment (train_data.py: the tool, source and fixture folders). Exit codes: 0
passed, 1 a failure, 77 skipped (a tool, the qwen2-mini fixture, numpy, gguf or safetensors missing).
"""
import json, math, os, shutil, sys, tempfile  # noqa: E401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, Checks, make_bin, mini_f32_gguf, need_fixture, need_tools, run_tool, skip  # noqa: E402

try:
    import gguf
    import numpy as np
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    skip(f"{e} (needs numpy, gguf and safetensors)")
TOOL = {t: os.path.join(BIN, "oomb-" + t) for t in ("train", "eval", "convert-hf")}
need_tools(*TOOL.values())
TRAIN, EVAL = TOOL["train"], TOOL["eval"]
MINI = need_fixture("qwen2-mini")
checks = Checks()


def check(ok, what):
    checks.check(ok, what)


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-nonfinite-") as tmp:
        clean = mini_f32_gguf(TOOL["convert-hf"], tmp)
        bad = os.path.join(tmp, "nan.gguf")
        shutil.copy(clean, bad)
        r = gguf.GGUFReader(bad, "r+")
        poked = 0
        for t in r.tensors:
            if t.name == "blk.1.attn_k.weight":
                t.data[0, :5] = np.nan
                poked += 1
        del r
        check(poked == 1, "blk.1.attn_k.weight found and poked")
        data = os.path.join(tmp, "data.bin")
        make_bin(data, 900, 2048, seed=3)
        for name, extra in (("dense", []), ("sparse", ["--sparse-pages", "2"]),
                            ("sparse-offload", ["--sparse-pages", "2", "--offload", "on", "--gpu-kv-budget", "0"])):
            for model, finite in ((clean, True), (bad, False)):
                js = os.path.join(tmp, "e.json")
                if os.path.exists(js):
                    os.remove(js)
                rc, out, err = run_tool([EVAL, "-m", model, "--data-bin", data, "--ctx", "300", "--chunk", "70", "--page", "7",
                                         "--threads", "2", "--json", js] + extra)
                nll = json.load(open(js))["mean_nll"] if os.path.exists(js) else None
                if finite:
                    check(rc == 0 and nll is not None and math.isfinite(nll), f"oomb-eval {name}, clean model: exit {rc}, mean NLL {nll}")
                else:
                    check(rc == 2 and "not finite" in err and (nll is None or not math.isfinite(nll)),
                          f"oomb-eval {name}, NaN K weights: exit 2 with 'not finite' (got {rc}, mean NLL {nll}: {err.strip()[-200:]})")

        ref = load_file(os.path.join(MINI, "reference-short.safetensors"))
        ids = os.path.join(tmp, "ids.safetensors")
        save_file({"input_ids": ref["input_ids"].astype(np.int32)}, ids)
        for name, extra in (("dense", []), ("sparse-offload", ["--sparse-pages", "2", "--offload", "on", "--gpu-kv-budget", "0"])):
            g = os.path.join(tmp, "g.safetensors")
            rc, out, err = run_tool([TRAIN, "-m", bad, "--tokens", ids, "--chunk", "13", "--page", "5", "--device", "cpu", "--threads", "2",
                                     "--dump-grads", g] + extra)
            loss = float(load_file(g)["loss"][0]) if rc == 0 else None
            check(rc == 0 and loss is not None and math.isnan(loss), f"--dump-grads {name}, NaN K weights: a NaN loss (exit {rc}, loss {loss})")

        rc, out, err = run_tool([TRAIN, "-m", bad, "--data-bin", data, "--ctx", "50", "--chunk", "13", "--page", "3", "--device", "cpu",
                                 "--threads", "2", "--steps", "5", "--eval-every", "0", "--out", os.path.join(tmp, "run"),
                                 "--sparse-pages", "2", "--offload", "on", "--gpu-kv-budget", "0"])
        check(rc == 2 and "3 consecutive steps with a non-finite loss" in err,
              f"training with NaN K weights (sparse + offload): stops with exit 2 after 3 non-finite steps (got {rc}: {err.strip()[-200:]})")
        # the stop names the damaged weight and the input model, not the learning rate (was: "try a lower --lr")
        check("'blk.1.attn_k.weight' (NaN at element 0)" in err and "-m" in err and "lower --lr" not in err,
              f"the stop names blk.1.attn_k.weight's NaN in -m, not --lr ({err.strip()[-300:]})")
        # a run that ends (--steps 2 < --max-bad-steps) with non-finite steps names it too
        rc, out, err = run_tool([TRAIN, "-m", bad, "--data-bin", data, "--ctx", "50", "--chunk", "13", "--page", "3", "--device", "cpu",
                                 "--threads", "2", "--steps", "2", "--eval-every", "0", "--out", os.path.join(tmp, "run2")])
        check(rc == 2 and "'blk.1.attn_k.weight' (NaN at element 0)" in err and "lower --lr" not in err,
              f"a run ending on non-finite steps names the weight (got {rc}: {err.strip()[-300:]})")
    checks.finish()


if __name__ == "__main__":
    main()
