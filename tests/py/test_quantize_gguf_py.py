#!/usr/bin/env python3
"""Our f32 -> Q4_K / Q5_K / Q6_K / Q5_0 quantizers (src/formats/quantize.cpp, through gguf_convert) against gguf-py.

A GGUF of f32 N(0,1) matrices (row lengths 256, 768, 4864, odd row counts 3, 5, 7; plus rows of 96
and 40 elements, which do not fit a 256-block) is written with gguf-py and re-typed by oomb-export
--out-type q4_k / q5_k / q6_k (no adapter: a pure conversion). For every output tensor:

  - its type is the one asked for, or llama.cpp's fallback for short rows (Q4_K -> Q5_0, Q5_K and
    Q6_K -> Q8_0; rows that are not whole 32-blocks -> F16);
  - gguf-py's gguf.quants.dequantize of our blocks equals, bit for bit, our own dequantization
    (oomb-export --out-type f32 of the quantized file);
  - the RMS error against the input, relative to the input's RMS, is below the bound of its type:
    Q4_K 0.085, Q5_K 0.043, Q6_K 0.021, Q5_0 0.050 (measured on these rows about 0.072, 0.036,
    0.018, 0.042: printed below), and above 0 (a lossy type cannot be exact);
  - Q5_0 blocks equal gguf-py's own quantizer's byte for byte (gguf.quants.quantize; gguf-py cannot
    quantize K-quants, so for those the dequantization is the reference).

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0 pass, 1 failure, 77 skipped.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import Checks, need_tools, run_tool, skip  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
EXPORT = os.path.join(BIN, "oomb-export")

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
except ImportError as e:
    skip(f"{e} (needs numpy and gguf)")

# (name, rows, row length)
SHAPES = [("a.weight", 3, 256), ("b.weight", 5, 768), ("c.weight", 7, 4864), ("d.weight", 4, 96), ("e.weight", 3, 40)]
BOUND = {T.Q4_K: 0.085, T.Q5_K: 0.043, T.Q6_K: 0.021, T.Q5_0: 0.050, T.Q8_0: 0.01, T.F16: 1e-3}
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q8_0, T.Q6_K: T.Q8_0}


def expected_type(want, ne0):
    if ne0 % 256 == 0:
        return want
    fb = FALLBACK[want]
    return fb if ne0 % 32 == 0 else T.F16


def main():
    need_tools(EXPORT)
    c = Checks()
    rng = np.random.default_rng(5)
    data = {name: rng.standard_normal((rows, ne0)).astype(np.float32) for name, rows, ne0 in SHAPES}
    with tempfile.TemporaryDirectory(prefix="oomb-py-quantize-") as tmp:
        src = os.path.join(tmp, "f32.gguf")
        w = gguf.GGUFWriter(src, "qwen2")
        for name, x in data.items():
            w.add_tensor(name, x)
        w.add_tensor("n.bias", np.ones(7, np.float32))  # 1-D: stays F32
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        for out_type, want in (("q4_k", T.Q4_K), ("q5_k", T.Q5_K), ("q6_k", T.Q6_K)):
            q = os.path.join(tmp, out_type + ".gguf")
            back = os.path.join(tmp, out_type + "-f32.gguf")
            rc, _, e = run_tool([EXPORT, "-m", src, "--out-type", out_type, "-o", q])
            c.check(rc == 0, f"oomb-export --out-type {out_type} (rc {rc}) {e.strip()[-200:]}")
            rc2, _, e2 = run_tool([EXPORT, "-m", q, "--out-type", "f32", "-o", back])
            c.check(rc2 == 0, f"oomb-export of the {out_type} file to f32 (rc {rc2}) {e2.strip()[-200:]}")
            if rc or rc2:
                continue
            rq, rb = gguf.GGUFReader(q), gguf.GGUFReader(back)
            qt = {t.name: t for t in rq.tensors}
            bt = {t.name: t for t in rb.tensors}
            c.check(qt["n.bias"].tensor_type == T.F32 and np.array_equal(np.array(qt["n.bias"].data), np.ones(7, np.float32)),
                    f"{out_type}: the 1-D tensor stays F32, unchanged")
            for name, rows, ne0 in SHAPES:
                t = qt[name]
                et = expected_type(want, ne0)
                c.check(t.tensor_type == et, f"{out_type}: {name} [{rows} x {ne0}] is {t.tensor_type.name} (expected {et.name})")
                ours = np.array(bt[name].data, dtype=np.float32).reshape(rows, ne0)
                theirs = gguf.quants.dequantize(np.array(t.data), t.tensor_type).reshape(rows, ne0).astype(np.float32)
                c.check(np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)),
                        f"{out_type}: {name}: gguf-py's dequantization of our {t.tensor_type.name} blocks == ours, bit for bit")
                x = data[name]
                rel = float(np.sqrt(np.mean((ours.astype(np.float64) - x) ** 2)) / np.sqrt(np.mean(x.astype(np.float64) ** 2)))
                c.check(0 < rel < BOUND[t.tensor_type],
                        f"{out_type}: {name}: {t.tensor_type.name} rms error / rms = {rel:.4f} (bound {BOUND[t.tensor_type]})")
                if t.tensor_type in (T.Q5_0, T.Q8_0):
                    ref = gguf.quants.quantize(x, t.tensor_type)
                    c.check(np.array_equal(np.array(t.data).reshape(ref.shape), ref),
                            f"{out_type}: {name}: our {t.tensor_type.name} blocks == gguf-py's quantizer's, byte for byte")
    c.finish()


if __name__ == "__main__":
    main()
