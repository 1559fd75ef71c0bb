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
import random
import subprocess
import sys
import tempfile

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

PIECES = [
    "a", "b", "Z", "the", " the", "Hello", " world", "'s", "'S", "'LL", "'ll", "'t", "'re", "'Ve", "'d", "'m", "'x", "n't",
    " ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u1680", "\u2000",
    "\u2009", "\u200a", "\u200b", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff",
    "0", "1", "9", "42", "2024", "١", "٣", "²", "½", "Ⅻ", "①",
    "e\u0301", "\u0301", "A\u030a", "o\u0308\u0304", "\u1100\u1161", "\u1100\u1161\u11a8", "가", "한국어", "ﬁ", "Å", "Ω", "K",
    "é", "ü", "ß", "İ", "ı", "ǅ", "中文", "日本語", "ไทย", "हिन्दी", "עברית", "عربي", "Русский", "Ελληνικά", "ქართული",
    "🙂", "👩\u200d👩\u200d👧", "🤖", "🇺🇸", "😀", "✓", "€", "£",
    "!", "?", ".", ",", ";", ":", "(", ")", "[", "]", "{", "}", "<", ">", "|", "=", "+", "-", "*", "/", "\\", "\"", "'",
    "`", "~", "@", "#", "$", "%", "^", "&", "_", "...", "->", "::", "!=",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<|im_st", "<|", "|>",
    "<|fim_prefix|>", "<think>", "<<|im_end|>>",
    "x" * 70, " " * 70, "=" * 100, "\n" * 5, "ab" * 40, "0" * 30, "\u0000", "\x7f", "\ue000", "\uffff",
]
RANGES = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f), (0xe00, 0xe7f),
          (0x1100, 0x11ff), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0x1f300, 0x1f64f)]


def main():
    tok = Tokenizer.from_file(os.path.join(FIX, "qwen-tokenizer", "tokenizer.json"))
    rng = random.Random(1234)
    cases = []
    for _ in range(3000):
        if rng.random() < 0.25:
            lo, hi = rng.choice(RANGES)
            s = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 20)))
        else:
            s = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12)))
        cases.append(s)
    with tempfile.TemporaryDirectory(prefix="oomb-py-tok-") as tmp:
        path = os.path.join(tmp, "cases.jsonl")
        with open(path, "w") as f:
            for s in cases:
                f.write(json.dumps({"text": s}) + "\n")
        out = subprocess.run([TOOL, "-m", os.path.join(SRC, "models", "qwen2.5-vocab.gguf"), "-f", path, "--jsonl"],
                             capture_output=True, check=True).stdout.decode().split("\n")
    bad = 0
    for s, line in zip(cases, out):
        want = tok.encode(s, add_special_tokens=False).ids
        got = [int(x) for x in line.split()]
        if want != got:
            bad += 1
            if bad <= 10:
                print(f"MISMATCH {s!r}\n  hf   {want}\n  ours {got}")
    print(f"{len(cases)} cases, {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
