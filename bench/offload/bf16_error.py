#!/usr/bin/env python3
"""Gradient error of bf16 KV-gradient pages (`--kv-grad-type bf16`, issue 12), for
bench/offload/bf16-error.sh. Needs numpy only (the GPU machine has no safetensors package: the
format is read and written here: an 8-byte little-endian header length, a JSON header, raw data).

  bf16_error.py tokens OUT.safetensors T VOCAB SEED   random input_ids int32 [1, T]
  bf16_error.py compare REF.safetensors A.safetensors [B.safetensors ...]
      per gradient tensor ||X - REF|| / ||REF|| (float64) for each X, the worst and the
      norm-weighted total ||X - REF|| / ||REF|| over all tensors, and the losses
"""
import json
import struct
import sys

import numpy as np

DT = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "F16": np.float16}


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        base = 8 + n
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        if v["dtype"] == "BF16":
            raw = np.frombuffer(mm[base + a:base + b], dtype=np.uint16).astype(np.uint32) << 16
            out[k] = raw.view(np.float32).reshape(v["shape"])
        else:
            out[k] = np.frombuffer(mm[base + a:base + b], dtype=DT[v["dtype"]]).reshape(v["shape"])
    return out


def save_ids(path, ids):
    data = ids.astype(np.int32).tobytes()
    head = json.dumps({"input_ids": {"dtype": "I32", "shape": list(ids.shape), "data_offsets": [0, len(data)]}}).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + data)


def main():
    if sys.argv[1] == "tokens":
        path, T, V, seed = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        save_ids(path, np.random.default_rng(seed).integers(0, V, size=(1, T)))
        return
    ref = load(sys.argv[2])
    names = sorted(k for k in ref if k.startswith("grad."))
    if not names:
        sys.exit(f"{sys.argv[2]}: no grad.* tensors")
    print(f"reference {sys.argv[2]}: {len(names)} gradient tensors, loss {float(np.asarray(ref.get('loss', [np.nan])).ravel()[0]):.6f}")
    for path in sys.argv[3:]:
        x = load(path)
        missing = [k for k in names if k not in x]
        if missing:
            sys.exit(f"{path}: missing {missing[:3]}")
        worst, num, den = ("", 0.0), 0.0, 0.0
        rows = []
        for k in names:
            r = ref[k].astype(np.float64).ravel()
            d = x[k].astype(np.float64).ravel() - r
            dn, rn = float(d @ d), float(r @ r)
            num += dn; den += rn
            rel = (dn / rn) ** 0.5 if rn > 0 else (0.0 if dn == 0 else float("inf"))
            rows.append((rel, k))
            if rel > worst[1]:
                worst = (k, rel)
        rows.sort(reverse=True)
        loss = float(np.asarray(x.get("loss", [np.nan])).ravel()[0])
        print(f"{path}: loss {loss:.6f}; total relative error {(num / den) ** 0.5:.3e}; worst {worst[0]} {worst[1]:.3e}")
        for rel, k in rows[:6]:
            print(f"   {rel:.3e}  {k}")
        med = sorted(r for r, _ in rows)[len(rows) // 2]
        print(f"   median over tensors {med:.3e}")


if __name__ == "__main__":
    main()
