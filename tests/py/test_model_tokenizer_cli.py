#!/usr/bin/env python3
"""A model GGUF whose tokenizer keys cannot be used (an unknown tokenizer.ggml.pre) is an error
naming the pre-tokenizer in oomb-train and oomb-eval, never "no tokenizer" and never a silent fall
back to the shipped Qwen vocabulary (a fresh review found both); a weights-only GGUF still falls
back (oomb-eval) or asks for --vocab (oomb-train).

The vocabulary models/qwen2.5-vocab.gguf with its pre value 'qwen2' patched to 'qwen9' (the same
length, in place), a --preset tiny model made from it with oomb-gguf-init.
Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0: passed, 1: failed, 77: a tool missing.
"""
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
TRAIN, EVAL, INIT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-eval", "oomb-gguf-init"))
VOCAB = os.path.join(SRC, "models", "qwen2.5-vocab.gguf")

for f in (TRAIN, EVAL, INIT, VOCAB):
    if not os.path.exists(f):
        print(f"SKIPPED: {f} missing")
        sys.exit(77)

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def patch_pre(src, dst, new):
    b = bytearray(open(src, "rb").read())
    key = b"tokenizer.ggml.pre"
    i = b.find(struct.pack("<Q", len(key)) + key)
    assert i >= 0, "no tokenizer.ggml.pre key"
    j = i + 8 + len(key) + 4  # the value: type u32, then the string (u64 length + bytes)
    n = struct.unpack("<Q", b[j:j + 8])[0]
    assert n == len(new), f"pre value of length {n}"
    b[j + 8:j + 8 + n] = new
    open(dst, "wb").write(b)


with tempfile.TemporaryDirectory(prefix="oomb-py-model-tok-") as d:
    vocab = os.path.join(d, "vocab-unknown-pre.gguf")
    patch_pre(VOCAB, vocab, b"qwen9")
    model = os.path.join(d, "tiny.gguf")
    r = subprocess.run([INIT, "--preset", "tiny", "--vocab", vocab, "--layers", "2", "-o", model], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: oomb-gguf-init: {r.stderr}")
    text = os.path.join(d, "fox.txt")
    open(text, "w").write("The quick brown fox jumps over the lazy dog. " * 40)
    r = subprocess.run([TRAIN, "-m", model, "--data", text, "--ctx", "32", "--steps", "1", "-o", os.path.join(d, "out")],
                       capture_output=True, text=True)
    check(r.returncode == 1 and "the model's tokenizer" in r.stderr and "qwen9" in r.stderr and "has no tokenizer" not in r.stderr,
          f"oomb-train: the unknown pre-tokenizer is named ({r.stderr.strip()[-240:]})")
    r = subprocess.run([EVAL, "-m", model, "--data", text, "--ctx", "32", "--max-tokens", "64"], capture_output=True, text=True)
    check(r.returncode == 1 and "qwen9" in r.stderr and "perplexity" not in r.stdout,
          f"oomb-eval: stops on the model's tokenizer, no fall back ({r.stderr.strip()[-240:]})")
    # with --data-bin no tokenizer is needed: training runs
    ids = os.path.join(d, "ids.bin")
    open(ids, "wb").write(struct.pack("<400I", *[(7 * i) % 1000 for i in range(400)]))
    r = subprocess.run([TRAIN, "-m", model, "--data-bin", ids, "--ctx", "32", "--steps", "1", "--save-every", "-1", "--eval-every", "0",
                        "-o", os.path.join(d, "out2")], capture_output=True, text=True)
    check(r.returncode == 0, f"oomb-train --data-bin with an unusable tokenizer still trains ({r.stderr.strip()[-200:]})")

if failures:
    sys.exit(f"FAIL: {len(failures)} check(s)")
print("ok: unusable model tokenizers are errors")
