#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses into fuzz/corpus/<name>/ (committed; rerun
after changing a seed): a few small valid files per reader, plus the bad inputs found by fuzzing
(issue 11). Plain struct packing, no third-party packages."""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(name, fname, data):
    d = os.path.join(ROOT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, fname), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- GGUF ---------------------------------------------------------------------------------------
def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv_u32(k, v):
    return gstr(k) + struct.pack("<II", 4, v)


def kv_str(k, v):
    return gstr(k) + struct.pack("<I", 8) + gstr(v)


def tinfo(name, ne, typ, off):
    return gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne) + struct.pack("<IQ", typ, off)


def gguf(kvs, tensors, data, align=32):
    h = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(tensors)
    h += b"\0" * (-len(h) % align)
    return h + data


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
put("gguf", "empty.gguf", gguf([], [], b""))
put("gguf", "kv-types.gguf", gguf(
    [kv_str("general.architecture", "qwen2"), kv_u32("qwen2.block_count", 2),
     gstr("f") + struct.pack("<If", 6, 0.5), gstr("b") + struct.pack("<IB", 7, 1),
     gstr("arr") + struct.pack("<IIQ", 9, 5, 3) + struct.pack("<3i", -1, 2, 3),
     gstr("strs") + struct.pack("<IIQ", 9, 8, 2) + gstr("a") + gstr("\u00e9"),
     gstr("nested") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 0, 2) + b"\x01\x02"], [], b""))
put("gguf", "tensors.gguf", gguf(
    [kv_u32("general.alignment", 32)],
    [tinfo("a", [4, 2], 0, 0), tinfo("h", [4], 1, 32), tinfo("q", [32], 8, 64), tinfo("z", [0], 0, 128)],
    f32(*range(8)) + struct.pack("<4H", 0x3C00, 0xBC00, 0, 0x4000) + b"\0" * 24 + b"\x00\x3c" + bytes(range(32)) + b"\0" * 30))
# bad: a tensor with no dimensions; many empty arrays (small version of the 50 MB file)
put("gguf", "bad-ndims0.gguf", gguf([], [tinfo("scalar", [], 0, 0)], f32(1.0)))
put("gguf", "bad-empty-arrays.gguf", gguf([gstr("k") + struct.pack("<IIQ", 9, 9, 200) + struct.pack("<IQ", 0, 0) * 200], [], b""))
put("gguf", "bad-empty-keys.gguf", gguf([gstr("") + struct.pack("<IIQ", 9, 0, 0)] * 150, [], b""))


# ---- safetensors ------------------------------------------------------------------------------------
def st(header, data):
    h = header if isinstance(header, str) else json.dumps(header)
    h += " " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h.encode() + data


put("safetensors", "small.safetensors", st(
    {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
     "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}, "c": {"dtype": "I64", "shape": [1], "data_offsets": [24, 32]},
     "e": {"dtype": "F16", "shape": [0, 4], "data_offsets": [32, 32]}}, f32(1, 2, 3, 4) + b"\x80\x3f" * 3 + b"\0\0" + struct.pack("<q", -7)))
put("safetensors", "f64.safetensors", st({"x": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}}, struct.pack("<2d", 0.5, -1e300)))
# bad: an overlap hidden behind a zero-size tensor; duplicate keys
put("safetensors", "bad-zero-size-overlap.safetensors", st(
    '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},'
    ' "c": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}', b"x" * 12))
put("safetensors", "bad-duplicate-key.safetensors", st(
    '{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', b"x" * 8))

# ---- tokenizer --------------------------------------------------------------------------------------
put("tokenizer", "hello.txt", "Hello world, it's 2024!\n  indented\tand <|im_start|>user\nhi<|im_end|>")
put("tokenizer", "unicode.txt", "caf\u00e9 cafe\u0301 \u4e2d\u6587 \u0041\u030a \u1100\u1161\u11a8 \U0001F642 na\u00efve")
put("tokenizer", "invalid-utf8.bin", b"ok \xff\xfe e\xcc\x81\xff\xcc\x81 \xed\xa0\x80 \xc0\xaf end")
put("tokenizer", "combining-marks.txt", "a" + "\u0301\u0316" * 600)  # the quadratic NFC case, small
