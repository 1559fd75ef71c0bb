#!/usr/bin/env python3
"""Differential test of our Qwen2 tokenizer against HF `tokenizers` on seeded random strings
(ASCII, every kind of Unicode whitespace, digits, combining marks, Hangul, many scripts, emoji,
contractions in any case, special tokens and fragments of them, long runs).

Runs `oomb-tokenize --jsonl` on models/qwen2.5-vocab.gguf and compares with
Tokenizer.from_file(qwen-tokenizer/tokenizer.json).encode(text, add_special_tokens=False).
Exit 77 (skipped) when `tokenizers` or the tool is missing.

Characters assigned after Unicode 13 are left out: our NFC (utf8proc 2.6) and regex classes
(PCRE2 10.42) use older Unicode tables than HF's, so such characters may be split differently.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_cases import count_mismatches, random_cases  # noqa: E402

try:
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

BIN = os.environ.get("OOMB_BIN_DIR", "build/bin")
SRC = os.environ.get("OOMB_SOURCE_DIR", ".")
FIX = os.environ.get("OOMB_FIXTURES") or os.environ.get("OOMB_FIXTURES_DEFAULT") or os.path.join(SRC, "..", "shared", "fixtures")
TOOL = os.path.join(BIN, "oomb-tokenize")
if not os.access(TOOL, os.X_OK):
    print(f"skip: {TOOL} not built")
    sys.exit(77)


def main():
    tok = Tokenizer.from_file(os.path.join(FIX, "qwen-tokenizer", "tokenizer.json"))
    cases = random_cases(1234, 3000)
    with tempfile.TemporaryDirectory(prefix="oomb-py-tok-") as tmp:
        path = os.path.join(tmp, "cases.jsonl")
        with open(path, "w") as f:
            for s in cases:
                f.write(json.dumps({"text": s}) + "\n")
        out = subprocess.run([TOOL, "-m", os.path.join(SRC, "models", "qwen2.5-vocab.gguf"), "-f", path, "--jsonl"],
                             capture_output=True, check=True).stdout.decode().split("\n")
    return 1 if count_mismatches(tok, cases, out) else 0


if __name__ == "__main__":
    sys.exit(main())
