#!/usr/bin/env python3
"""A frozen quantized base through the command line (--base-type keep), CPU backend.

A tiny Qwen2 (hidden 256, ffn 768, 2 layers) whose seven projections per layer are block types
(K-quants as random blocks, Q5_0 / Q5_1 / Q8_0 quantized by gguf-py: test_gguf_kquants.py's file):
  - oomb-eval NLL with --base-type keep (projections stay quantized, dequantized per tile inside the
    products) == --base-type f32 (dequantized on load) to 1e-5 relative: both compute the same f32
    products from bit-identical f32 weights, in different blockings (rounding only); the weights
    line counts fewer bytes with keep.
  - oomb-train --trainable lora on the kept base: finite, falling loss; adapter.gguf written; a
    resumed run (3 + 3 steps) gives the losses of a straight 6-step run, bit for bit.
  - --dump-grads --trainable lora: the adapter's gradients with the base kept vs dequantized to f32
    agree to 1e-4 relative (L2), and the B gradients are not zero.
  - --base-type keep with --trainable all is refused, naming the options.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0 pass, 1 failure, 77 skipped.
"""
import json
import math
import os
import re
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_data import Checks, make_bin, need_tools, read_log, run_tool, skip  # noqa: E402

SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
TRAIN, EVAL, INIT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-eval", "oomb-gguf-init"))

try:
    import numpy as np
    import gguf
    import test_gguf_kquants as kq  # the quantized model's recipe (random K-quant blocks, gguf-py's Q5_0 / Q5_1 / Q8_0)
except ImportError:  # pragma: no cover
    gguf = None

C = Checks()


def make_quant_model(tmp):
    base = os.path.join(tmp, "f32.gguf")
    rc, _, e = run_tool([INIT, "--vocab-size", "512", "--hidden", "256", "--ffn", "768", "--layers", "2", "--heads", "4",
                         "--kv-heads", "2", "--tied", "--outtype", "f32", "--seed", "5", "-o", base])
    C.check(rc == 0, f"oomb-gguf-init makes a small model {e.strip()[-200:]}")
    r = gguf.GGUFReader(base)
    rng = np.random.default_rng(14)
    tensors, used = [], set()
    for t in r.tensors:
        data = np.array(t.data)
        m = re.match(r"blk\.(\d+)\.(\w+)\.weight$", t.name)
        if not m or m.group(2) not in kq.PROJ:
            tensors.append((t.name, data, None))
            continue
        qtype = kq.TYPES[(kq.PROJ.index(m.group(2)) + int(m.group(1))) % len(kq.TYPES)]
        used.add(qtype.name)
        rows, cols = data.shape
        q = kq.random_kquant(rng, qtype, rows, cols) if qtype in kq.F16_FIELDS else gguf.quants.quantize(data.astype(np.float32), qtype)
        tensors.append((t.name, q, qtype))
    path = os.path.join(tmp, "quant.gguf")
    kq.write(path, r, tensors)
    return path, used


def eval_nll(model, data, base_type):
    js = model + "." + base_type + ".json"
    rc, o, e = run_tool([EVAL, "-m", model, "--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--max-tokens", "256",
                         "--threads", "2", "--base-type", base_type, "--json", js])
    res = json.load(open(js)) if rc == 0 and os.path.exists(js) else None
    return res, o + e


def weight_bytes(out):
    m = re.search(r"weights: ([0-9.]+) (B|KiB|MiB|GiB)", out)
    if not m:
        return None
    return float(m.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]


def write_ids(path, ids):
    """input_ids int32 [1, T] as safetensors."""
    raw = struct.pack(f"<{len(ids)}i", *ids)
    hdr = json.dumps({"input_ids": {"dtype": "I32", "shape": [1, len(ids)], "data_offsets": [0, len(raw)]}}).encode()
    hdr += b" " * ((8 - len(hdr) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + raw)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        body = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32"
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(body[a:b], dtype="<f4").reshape(v["shape"])
    return out


def main():
    need_tools(TRAIN, EVAL, INIT)
    if gguf is None:
        skip("Python packages numpy / gguf")
    with tempfile.TemporaryDirectory(prefix="oomb-py-qbase-") as tmp:
        model, used = make_quant_model(tmp)
        C.check({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "Q8_0"} <= used, f"block types used: {sorted(used)}")
        data = os.path.join(tmp, "ids.bin")
        make_bin(data, 12000, 512)

        # oomb-eval: keep == f32 to 1e-5 relative; keep holds fewer bytes
        keep, ok_out = eval_nll(model, data, "keep")
        f32, f_out = eval_nll(model, data, "f32")
        C.check(keep is not None and f32 is not None, f"oomb-eval with --base-type keep / f32 {ok_out.strip()[-300:]} {f_out.strip()[-300:]}")
        if keep and f32:
            a, b = keep["mean_nll"], f32["mean_nll"]
            C.check(math.isfinite(a) and abs(a - b) <= 1e-5 * abs(b) and keep["targets"] == f32["targets"] == 252,
                    f"NLL keep {a!r} == f32 {b!r} to 1e-5 relative (252 targets)")
        wk, wf = weight_bytes(ok_out), weight_bytes(f_out)
        C.check(wk is not None and wf is not None and wk < 0.5 * wf, f"weights line: keep {wk} bytes < half of f32 {wf}")

        # oomb-train --trainable lora on the kept base
        common = ["--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--lr", "3e-2", "--warmup", "2",
                  "--eval-seqs", "4", "--threads", "2", "--seed", "7", "--trainable", "lora", "--lora-rank", "8"]
        out = os.path.join(tmp, "run")
        rc, o, e = run_tool([TRAIN, "-m", model] + common + ["--steps", "16", "--eval-every", "0", "--save-every", "0", "--out", out])
        C.check(rc == 0 and "quantized projections kept" in o, f"16 LoRA steps on the quantized base (rc {rc}) {e.strip()[-300:]}")
        if rc == 0:
            losses = [l for _, l in read_log(out)[0]]
            first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
            C.check(len(losses) == 16 and all(math.isfinite(x) for x in losses) and last < first - 0.1,
                    f"finite, falling training loss {first:.3f} -> {last:.3f}")
            C.check(os.path.exists(os.path.join(out, "adapter.gguf")), "adapter.gguf written")

        # resume: 6 straight == 3 + resume 3
        A, B = os.path.join(tmp, "A"), os.path.join(tmp, "B")
        args = [TRAIN, "-m", model] + common + ["--steps", "6", "--save-every", "3", "--eval-every", "3"]
        rc1, _, e1 = run_tool(args + ["--out", A])
        rc2, _, e2 = run_tool(args + ["--out", B, "--stop-after", "3"])
        rc3, o3, e3 = run_tool(args + ["--out", B, "--resume"])
        C.check(rc1 == 0 and rc2 == 0 and rc3 == 0 and "resume: from step 3" in o3,
                f"straight, stopped and resumed runs {e1.strip()[-150:]} {e2.strip()[-150:]} {e3.strip()[-150:]}")
        if rc1 == 0 and rc3 == 0:
            la, lb = read_log(A), read_log(B)
            C.check(la == lb and len(la[0]) == 6, f"resume: identical train and held-out losses ({la[0][-1]} {lb[0][-1]})")
        # a resume with another --base-type is noted (the frozen base's numbers change), not silent
        rc4, o4, e4 = run_tool(args[:-6] + ["--steps", "7", "--save-every", "3", "--eval-every", "0", "--out", B, "--resume",
                                            "--base-type", "f32"])
        C.check(rc4 == 0 and 'resume: note: --base-type changed from "keep" to "f32"' in o4,
                f"resume with --base-type f32 after keep: noted (rc {rc4}) {e4.strip()[-150:]}")

        # --dump-grads --trainable lora: keep vs f32 base
        toks = os.path.join(tmp, "toks.safetensors")
        write_ids(toks, [x % 512 for x in make_bin(os.path.join(tmp, "t.bin"), 80, 512, seed=3)])
        grads = {}
        for bt in ("keep", "f32"):
            g = os.path.join(tmp, f"grads-{bt}.safetensors")
            rc, o, e = run_tool([TRAIN, "-m", model, "--tokens", toks, "--dump-grads", g, "--chunk", "32", "--page", "16",
                                 "--threads", "2", "--trainable", "lora", "--lora-rank", "8", "--seed", "7", "--base-type", bt])
            C.check(rc == 0, f"--dump-grads --trainable lora --base-type {bt} (rc {rc}) {e.strip()[-300:]}")
            grads[bt] = read_safetensors(g) if rc == 0 else None
        if grads["keep"] is not None and grads["f32"] is not None:
            gk, gf = grads["keep"], grads["f32"]
            names = sorted(k for k in gf if k.startswith("grad."))
            C.check(names == sorted(k for k in gk if k.startswith("grad.")) and len(names) == 2 * 7 * 2,
                    f"the same {len(names)} adapter gradients (A and B of 7 projections x 2 layers)")
            worst, nb = 0.0, 0
            for k in names:
                num = float(np.linalg.norm(gk[k] - gf[k]))
                den = float(np.linalg.norm(gf[k]))
                if den > 0:
                    worst = max(worst, num / den)
                nb += k.endswith("lora_b") and den > 0
            C.check(worst <= 1e-4 and nb == 14, f"gradients keep vs f32 agree: worst relative L2 difference {worst:.3g}; {nb} non-zero B gradients")
            C.check(abs(float(gk["loss"][0]) - float(gf["loss"][0])) <= 1e-5 * abs(float(gf["loss"][0])), "same loss")

        # --dump-grads --trainable linear: every weight's gradient, and a note saying so (was: silent)
        g = os.path.join(tmp, "grads-linear.safetensors")
        rc, o, e = run_tool([TRAIN, "-m", model, "--tokens", toks, "--dump-grads", g, "--chunk", "32", "--page", "16", "--threads", "2",
                             "--trainable", "linear"])
        C.check(rc == 0 and "ignores the training options given: --trainable linear" in e,
                f"--dump-grads --trainable linear: a note that it is ignored (rc {rc}) {e.strip()[-200:]}")

        rc, o, e = run_tool([TRAIN, "-m", model, "--data-bin", data, "--ctx", "64", "--steps", "1", "--trainable", "all",
                             "--base-type", "keep", "--out", os.path.join(tmp, "bad")])
        C.check(rc == 1 and "--base-type keep" in e and "--trainable lora" in e, f"--base-type keep with --trainable all refused ({e.strip()[-200:]})")
    C.finish()


if __name__ == "__main__":
    main()
