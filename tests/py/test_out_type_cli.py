#!/usr/bin/env python3
"""oomb-train --out-type f32|f16|bf16|q8_0 (full-model checkpoints; default bf16):

  - the same run saved in each type: model.gguf's 2-D weights are in that type, norms and biases F32
    (gguf-py), and their bytes equal gguf-py's gguf.quants.quantize of the f32 run's weights (F16 and
    BF16 rounding, Q8_0 blocks), the 1-D tensors equal the f32 run's; general.file_type matches;
  - our loader reads each file (oomb-eval), and the NLL is close to the f32 model's;
  - --resume from a bf16 and from a q8_0 checkpoint continues to the last step (not bit-exact to a
    straight run: the weights were rounded);
  - the default is bf16; an unknown type and --out-type with --trainable lora are clear errors (exit 1).

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0: all passed; 1: a failure; 77
(skip, with a SKIPPED line): a tool or numpy / gguf missing.
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import Checks, make_bin, read_log, run_tool as run, need_tools, skip  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
TRAIN, EVAL, INIT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-eval", "oomb-gguf-init"))


try:
    import numpy as np
    import gguf
    from gguf import quants
except ImportError as e:
    skip(f"{e} (needs numpy and gguf)")
need_tools(TRAIN, EVAL, INIT)

checks = Checks()
check = checks.check
Q = gguf.GGMLQuantizationType
TYPES = {"f32": (Q.F32, 0), "f16": (Q.F16, 1), "bf16": (Q.BF16, 32), "q8_0": (Q.Q8_0, 7)}


def nll(model, data):
    rc, o, e = run([EVAL, "-m", model, "--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--threads", "2",
                    "--max-tokens", "256"])
    m = re.search(r"mean NLL: ([0-9.]+)", o)
    return (float(m.group(1)) if rc == 0 and m else None), e


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-outtype-") as tmp:
        base, data = os.path.join(tmp, "qwen2.gguf"), os.path.join(tmp, "ids.bin")
        shape = {"--vocab-size": 384, "--hidden": 96, "--ffn": 192, "--layers": 2, "--heads": 3, "--kv-heads": 1}
        rc, o, e = run([INIT] + [str(x) for kv in shape.items() for x in kv] + ["--outtype", "f32", "--seed", "3", "-o", base])
        check(rc == 0, f"oomb-gguf-init {e.strip()[-200:]}")
        make_bin(data, 8000, shape["--vocab-size"])
        cmd = [TRAIN, "-m", base, "--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--lr", "1e-2",
               "--warmup", "1", "--eval-every", "0", "--eval-seqs", "2", "--threads", "2", "--seed", "7"]
        files = {}
        for t in TYPES:
            out = os.path.join(tmp, "run-" + t)
            rc, o, e = run(cmd + ["--steps", "3", "--save-every", "0", "--out-type", t, "--out", out])
            check(rc == 0, f"--out-type {t}: 3 steps {e.strip()[-200:]}")
            files[t] = os.path.join(out, "model.gguf")
        out = os.path.join(tmp, "run-default")
        rc, o, e = run(cmd + ["--steps", "3", "--save-every", "0", "--out", out])
        check(rc == 0 and open(os.path.join(out, "model.gguf"), "rb").read() == open(files["bf16"], "rb").read(),
              f"the default --out-type is bf16 (identical model.gguf) {e.strip()[-200:]}")
        ref = {x.name: np.array(x.data, dtype=np.float32) for x in gguf.GGUFReader(files["f32"]).tensors}
        f32_nll, _ = nll(files["f32"], data)
        for t, (qt, ftype) in TYPES.items():
            r = gguf.GGUFReader(files[t])
            ok_types = ok_bytes = True
            for x in r.tensors:
                two_d = len(x.shape) == 2
                want_t = qt if two_d else Q.F32
                ok_types &= x.tensor_type == want_t
                v = ref[x.name].reshape([int(d) for d in reversed(x.shape)]) if two_d else ref[x.name]
                want = quants.quantize(v, want_t) if want_t != Q.F32 else v
                ok_bytes &= np.array_equal(np.asarray(x.data).view(np.uint8).reshape(-1), np.asarray(want).view(np.uint8).reshape(-1))
            check(ok_types, f"{t}: 2-D weights {qt.name}, norms and biases F32")
            check(ok_bytes, f"{t}: every tensor's bytes == gguf-py's quantize of the f32 run's values")
            check(int(r.fields["general.file_type"].parts[-1][0]) == ftype, f"{t}: general.file_type {ftype}")
            v, e = nll(files[t], data)
            check(v is not None and f32_nll is not None and abs(v - f32_nll) < 2e-2 * f32_nll,
                  f"{t}: our loader reads it; NLL {v} vs f32's {f32_nll} {e.strip()[-200:]}")
        # --resume from rounded checkpoints
        for t in ("bf16", "q8_0"):
            out = os.path.join(tmp, "resume-" + t)
            rc1, _, e1 = run(cmd + ["--steps", "4", "--save-every", "1", "--out-type", t, "--out", out, "--stop-after", "2"])
            rc2, o2, e2 = run(cmd + ["--steps", "4", "--save-every", "1", "--out-type", t, "--out", out, "--resume"])
            train, _ = read_log(out) if rc2 == 0 else ([], [])
            check(rc1 == 0 and rc2 == 0 and "resume: from step 2" in o2 and [s for s, _ in train] == [1, 2, 3, 4],
                  f"--out-type {t}: --resume from the step-2 checkpoint runs to step 4 {e1.strip()[-200:]} {e2.strip()[-200:]}")
        # errors
        rc, o, e = run(cmd + ["--steps", "1", "--out-type", "q4_k", "--out", os.path.join(tmp, "bad")])
        check(rc == 1 and "--out-type must be f32, f16, bf16 or q8_0, got 'q4_k'" in e, f"unknown --out-type: refused ({e.strip()[-200:]})")
        rc, o, e = run(cmd + ["--steps", "1", "--trainable", "lora", "--out-type", "f16", "--out", os.path.join(tmp, "bad")])
        check(rc == 1 and "--out-type" in e and "--trainable lora" in e, f"--out-type with --trainable lora: refused ({e.strip()[-200:]})")
    checks.finish()


if __name__ == "__main__":
    main()
