#!/usr/bin/env python3
"""Random quantized bases of presets through the command line (--preset --base-type q4_k_m ...), CPU.

  - oomb-train --preset tiny --trainable lora --base-type q4_k_m: the layers' projections made as
    random blocks (the tiny preset's 64- and 192-wide rows take llama.cpp's fallbacks Q5_0 / Q8_0),
    6 LoRA steps with finite losses; adapter.gguf written; the weights line counts fewer
    bytes than the same preset with --base-type f32.
  - q4_k, q6_k and q8_0 run one step each with a finite loss.
  - refused with a clear error: a block --base-type with -m (pointing to oomb-export), with
    --trainable all, an unknown --base-type, --trainable lora with neither -m nor --preset.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0 pass, 1 failure, 77 skipped.
"""
import math
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_data import Checks, make_bin, need_tools, read_log, run_tool  # noqa: E402

SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
TRAIN, INIT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-gguf-init"))

C = Checks()


def weight_bytes(out):
    m = re.search(r"weights ([0-9.]+) (B|KiB|MiB|GiB)", out)
    if not m:
        return None
    return float(m.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]


def main():
    need_tools(TRAIN, INIT)
    with tempfile.TemporaryDirectory(prefix="oomb-py-qpreset-") as tmp:
        data = os.path.join(tmp, "ids.bin")
        make_bin(data, 6000, 151936)
        common = ["--preset", "tiny", "--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--lr", "3e-2",
                  "--warmup", "1", "--eval-every", "0", "--threads", "2", "--seed", "7", "--trainable", "lora", "--lora-rank", "8"]

        out = os.path.join(tmp, "q4km")
        rc, o, e = run_tool([TRAIN] + common + ["--base-type", "q4_k_m", "--steps", "6", "--save-every", "0", "--out", out])
        C.check(rc == 0 and "random projections in block types: --base-type q4_k_m" in o and "random weights made in" in o,
                f"6 LoRA steps on a random q4_k_m base of the tiny preset (rc {rc}) {o.strip()[-300:]} {e.strip()[-300:]}")
        wq = weight_bytes(o)
        if rc == 0:
            losses = [l for _, l in read_log(out)[0]]
            C.check(len(losses) == 6 and all(math.isfinite(x) for x in losses), f"6 finite losses {losses}")
            C.check(os.path.exists(os.path.join(out, "adapter.gguf")), "adapter.gguf written")
        rc, o, e = run_tool([TRAIN] + common + ["--base-type", "f32", "--steps", "1", "--save-every", "-1", "--out", os.path.join(tmp, "f32")])
        wf = weight_bytes(o)
        C.check(rc == 0 and wq is not None and wf is not None and wq < wf,
                f"weights line: q4_k_m {wq} bytes < f32 {wf} (rc {rc}) {e.strip()[-200:]}")

        for bt in ("q4_k", "q6_k", "q8_0"):
            d = os.path.join(tmp, bt)
            rc, o, e = run_tool([TRAIN] + common + ["--base-type", bt, "--steps", "1", "--save-every", "-1", "--out", d])
            ok = rc == 0 and all(math.isfinite(l) for _, l in read_log(d)[0]) and len(read_log(d)[0]) == 1
            C.check(ok, f"--base-type {bt}: one step, finite loss (rc {rc}) {e.strip()[-300:]}")

        # refusals
        model = os.path.join(tmp, "m.gguf")
        rc, _, e = run_tool([INIT, "--vocab-size", "512", "--hidden", "64", "--ffn", "128", "--layers", "1", "--heads", "2",
                             "--kv-heads", "1", "--tied", "--outtype", "f32", "-o", model])
        C.check(rc == 0, f"oomb-gguf-init {e.strip()[-200:]}")
        rest = ["--data-bin", data, "--ctx", "64", "--steps", "1", "--out", os.path.join(tmp, "bad")]
        rc, _, e = run_tool([TRAIN, "-m", model, "--trainable", "lora", "--base-type", "q4_k_m"] + rest)
        C.check(rc == 1 and "oomb-export --out-type q4_k_m" in e and "--preset" in e, f"-m with --base-type q4_k_m refused ({e.strip()[-300:]})")
        rc, _, e = run_tool([TRAIN, "--preset", "tiny", "--trainable", "all", "--base-type", "q8_0"] + rest)
        C.check(rc == 1 and "--base-type q8_0" in e and "--trainable lora" in e, f"--trainable all with --base-type q8_0 refused ({e.strip()[-300:]})")
        rc, _, e = run_tool([TRAIN, "--preset", "tiny", "--trainable", "lora", "--base-type", "q5_1"] + rest)
        C.check(rc == 1 and "'q5_1'" in e and "q4_k_m, q4_k, q6_k or q8_0" in e, f"unknown --base-type refused ({e.strip()[-300:]})")
        rc, _, e = run_tool([TRAIN, "--trainable", "lora"] + rest)
        C.check(rc == 1 and "-m BASE.gguf or --preset NAME" in e, f"--trainable lora without a base refused ({e.strip()[-300:]})")
    C.finish()


if __name__ == "__main__":
    main()
