#!/usr/bin/env python3
"""A tiny Qwen2 whose linear weights are K-quants (and Q5_0/Q5_1/Q8_0) through oomb-eval.

oomb-gguf-init makes a small random Qwen2 (f32, hidden 256, ffn 768, 2 layers); gguf-py rewrites it
with every linear weight in a block type (one type per projection, rotated between the layers):
Q5_0, Q5_1, Q8_0 quantized by gguf-py from the f32 weights, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K as random
blocks with small f16 scales (gguf-py cannot quantize K-quants). A second file holds gguf-py's
dequantization of the same blocks as F32. oomb-eval must print the same NLL for both, to the last
digit (the load dequantizes bit-exactly as gguf.quants.dequantize), and a finite one. A weight in
IQ2_XXS is refused with exit code 1 and a message naming the type and the tensor.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0 pass, 1 failure, 77 skipped.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
EVAL = os.path.join(BIN, "oomb-eval")
INIT = os.path.join(BIN, "oomb-gguf-init")

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf.constants import GGML_QUANT_SIZES
except ImportError:  # pragma: no cover
    gguf = None

failures = []


def check(cond, what):
    print(f"  {'ok  ' if cond else 'FAIL'} {what}")
    if not cond:
        failures.append(what)


def run(args):
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


# byte offsets of the f16 scales in a block (ggml-common.h)
F16_FIELDS = {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]} if gguf else {}
PROJ = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
TYPES = [T.Q4_K, T.Q5_K, T.Q6_K, T.Q3_K, T.Q2_K, T.Q5_0, T.Q5_1, T.Q8_0] if gguf else []


def random_kquant(rng, qtype, rows, cols):
    block, size = GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        h = (rng.uniform(1e-5, 1e-4, size=n) * np.where(rng.integers(0, 2, size=n) == 1, -1, 1)).astype(np.float16)
        b[:, off:off + 2] = h.view(np.uint8).reshape(n, 2)
    return b.reshape(rows, cols // block * size)


def copy_kv(r, w):
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), vtype, sub_type=sub)


def write(path, r, tensors):
    w = gguf.GGUFWriter(path, arch="qwen2")
    copy_kv(r, w)
    for name, data, qtype in tensors:
        if qtype is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def nll(model, data):
    """oomb-eval's results (its --json file, all digits) or None, and its output. --base-type f32: the
    weights dequantized on load, the reader's bit-exactness (--base-type keep: test_quant_base_cli.py)."""
    js = model + ".json"
    rc, o, e = run([EVAL, "-m", model, "--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16",
                    "--max-tokens", "256", "--threads", "2", "--base-type", "f32", "--json", js])
    res = json.load(open(js)) if rc == 0 and os.path.exists(js) else None
    return rc, res, o + e


def main():
    missing = [p + " (not built)" for p in (EVAL, INIT) if not os.path.exists(p)]
    missing += ["Python packages numpy / gguf"] if gguf is None else []
    if missing:
        print("SKIPPED: missing " + ", ".join(missing))
        return 77
    tmp = tempfile.mkdtemp(prefix="oomb-kquants-")
    try:
        base = os.path.join(tmp, "f32.gguf")
        rc, o, e = run([INIT, "--vocab-size", "512", "--hidden", "256", "--ffn", "768", "--layers", "2", "--heads", "4",
                        "--kv-heads", "2", "--tied", "--outtype", "f32", "--seed", "5", "-o", base])
        check(rc == 0, f"oomb-gguf-init makes a small model {e.strip()[-200:]}")
        if rc:
            return 1
        r = gguf.GGUFReader(base)
        rng = np.random.default_rng(14)
        quant, deq, used = [], [], set()
        for t in r.tensors:
            data = np.array(t.data)
            m = re.match(r"blk\.(\d+)\.(\w+)\.weight$", t.name)
            if not m or m.group(2) not in PROJ:
                quant.append((t.name, data, None))
                deq.append((t.name, data, None))
                continue
            qtype = TYPES[(PROJ.index(m.group(2)) + int(m.group(1))) % len(TYPES)]
            used.add(qtype.name)
            rows, cols = data.shape
            if qtype in F16_FIELDS:
                q = random_kquant(rng, qtype, rows, cols)
            else:
                q = gguf.quants.quantize(data.astype(np.float32), qtype)
            quant.append((t.name, q, qtype))
            deq.append((t.name, gguf.quants.dequantize(q, qtype).astype(np.float32), None))
        check({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"} <= used, f"types used: {sorted(used)}")
        qpath, dpath = os.path.join(tmp, "quant.gguf"), os.path.join(tmp, "deq.gguf")
        write(qpath, r, quant)
        write(dpath, r, deq)
        rq = gguf.GGUFReader(qpath)
        check(sorted({t.tensor_type.name for t in rq.tensors}) == sorted(used | {"F32"}), "quant.gguf holds the block types")

        data = os.path.join(tmp, "ids.bin")
        ids = np.random.default_rng(3).integers(0, 512, size=2000).astype("<u4")
        ids.tofile(data)
        rc_q, nll_q, out_q = nll(qpath, data)
        rc_d, nll_d, out_d = nll(dpath, data)
        check(rc_q == 0 and nll_q is not None, f"oomb-eval on the quantized model {out_q.strip()[-300:] if rc_q else nll_q}")
        check(rc_d == 0 and nll_d is not None, f"oomb-eval on gguf-py's dequantization {out_d.strip()[-300:] if rc_d else nll_d}")
        rc_b, nll_b, out_b = nll(base, data)
        check(rc_b == 0 and nll_b is not None, f"oomb-eval on the f32 model {out_b.strip()[-300:] if rc_b else ''}")
        if nll_q and nll_d and nll_b:
            q, d, b = (x["mean_nll"] for x in (nll_q, nll_d, nll_b))
            check(q == d and nll_q["perplexity"] == nll_d["perplexity"] and nll_q["targets"] == 252,
                  f"same NLL, every digit: quantized {q!r} == gguf-py dequantized {d!r} (252 targets)")
            check(q != b, f"the quantized weights are not the f32 ones (NLL {q!r} vs f32 {b!r})")
            check(math.isfinite(q) and abs(q - math.log(512)) < 2.0,
                  f"NLL {q} is finite and near ln(512) = {math.log(512):.3f} (a random model)")

        # an IQ2_XXS weight: refused, naming the type and the tensor
        bad = list(quant)
        name, q, _ = bad[[i for i, x in enumerate(bad) if x[0].endswith("attn_q.weight")][0]]
        rows = q.shape[0]
        cols = 256  # hidden: one IQ2_XXS block (66 bytes) per row
        iq = rng.integers(0, 256, size=(rows, GGML_QUANT_SIZES[T.IQ2_XXS][1] * cols // 256), dtype=np.uint8)
        bad[[i for i, x in enumerate(bad) if x[0] == name][0]] = (name, iq, T.IQ2_XXS)
        ipath = os.path.join(tmp, "iq.gguf")
        write(ipath, r, bad)
        rc, nll_i, out = nll(ipath, data)
        check(rc == 1 and "IQ2_XXS" in out and name in out and "Segmentation" not in out,
              f"IQ2_XXS weight refused (rc {rc}): {out.strip()[-300:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
