#!/usr/bin/env python3
"""Differential test of our tokenizer against HF `tokenizers` on SmolLM2's own vocabulary
(tests/fixtures/smollm2-vocab.gguf) under each pre-tokenizer: smollm (the file's own), and gpt-2,
llama-bpe and qwen2 on the same vocabulary (tests of those regexes and of ignore_merges).

For each, a copy of the vocab GGUF with tokenizer.ggml.pre set is written (gguf-py), the HF
tokenizer is built from its vocabulary and merges (tests/fixtures/make-smollm2-tokenizer.py), and
`oomb-tokenize --jsonl` must give HF's ids on the fixed texts of that script and on seeded random
strings (tests/py/tokenizer_cases.py plus SmolLM2's special tokens and bytes it has no token for).
Then decode is checked through the tool: the ids of a file, --decode, give its bytes back, less
those the vocabulary has no token for (which the tool counts in a warning).
Exit 77 (skipped) when `tokenizers`, `gguf` or the tool is missing.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tokenizer_cases import count_mismatches, random_cases  # noqa: E402

try:
    import gguf  # noqa: F401
    import tokenizers  # noqa: F401
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

BIN = os.environ.get("OOMB_BIN_DIR", "build/bin")
SRC = os.environ.get("OOMB_SOURCE_DIR", os.path.join(HERE, "..", ".."))
TOOL = os.path.join(BIN, "oomb-tokenize")
if not os.access(TOOL, os.X_OK):
    print(f"skip: {TOOL} not built")
    sys.exit(77)
VOCAB = os.path.join(SRC, "tests", "fixtures", "smollm2-vocab.gguf")

spec = importlib.util.spec_from_file_location("make_smollm2", os.path.join(SRC, "tests", "fixtures",
                                                                           "make-smollm2-tokenizer.py"))
make = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make)

EXTRA = ["<repo_name>", "<file_sep>", "<jupyter_code>", "<empty_output>", "<empty_output", "<|im_start|>assistant\n",
         "\x04", "\x06", "\x13\x14", "\x1d", "\U000e0067", "\U000f0001", "\U0010fffd", "12345678", " 2024", "a1b2",
         "def f(x):\n    return x\n", "    ", "\t\t", "'S", "'ll"]


def run_tool(model, path, *args):
    return subprocess.run([TOOL, "-m", model, "-f", path, *args], capture_output=True, check=True)


def main():
    vocab = make.read_vocab(VOCAB)
    tokens, types = vocab[0], vocab[1]
    byte_tok = {b for b in range(256) if make_bytelevel(b) in set(tokens)}
    cases = list(make.TEXTS) + random_cases(4321, 2500, EXTRA)
    bad = 0
    with tempfile.TemporaryDirectory(prefix="oomb-py-smollm2-") as tmp:
        jsonl = os.path.join(tmp, "cases.jsonl")
        with open(jsonl, "w") as f:
            for s in cases:
                f.write(json.dumps({"text": s}) + "\n")
        for pre in make.PRES:
            model = os.path.join(tmp, f"vocab-{pre}.gguf")
            make.write_vocab_gguf(VOCAB, model, pre=pre)
            hf = make.build_tokenizer(tokens, types, vocab[2], pre)
            out = run_tool(model, jsonl, "--jsonl").stdout.decode().split("\n")
            bad += count_mismatches(hf, cases, out, f"{pre}: ")
        # decode through the tool: exact bytes back, less the bytes without a token
        text = "".join(cases).encode()
        txt = os.path.join(tmp, "all.txt")
        with open(txt, "wb") as f:
            f.write(text)
        enc = run_tool(VOCAB, txt)
        ids_path = os.path.join(tmp, "ids.txt")
        with open(ids_path, "wb") as f:
            f.write(enc.stdout)
        back = run_tool(VOCAB, ids_path, "--decode").stdout
        want = bytes(b for b in text if b in byte_tok)
        n_missing = len(text) - len(want)
        warned = f"{n_missing} input byte(s) have no token" in enc.stderr.decode()
        print(f"decode: {len(text)} bytes, {n_missing} without a token, round trip "
              f"{'exact' if back == want else 'DIFFERS'}, warning {'given' if warned else 'MISSING'}")
        if back != want or not warned or n_missing == 0:
            bad += 1
    return 1 if bad else 0


def make_bytelevel(b):
    """The GPT-2 byte-level character of byte b."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


if __name__ == "__main__":
    sys.exit(main())
