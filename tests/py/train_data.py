"""Training data and logs for the CLI tests (test_train_cli.py, test_lora_cli.py): a learnable id stream."""
import json
import os
import random
import struct
import subprocess
import sys

# The CLI tests' folders (set by CTest; defaults for a run by hand from the source tree).
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
FIX = os.environ.get("OOMB_FIXTURES") or os.environ.get("OOMB_FIXTURES_DEFAULT") or os.path.join(SRC, "..", "shared", "fixtures")


def make_bin(path, n, vocab, seed=0):
    """A learnable id stream: a noisy cyclic pattern, little-endian uint32."""
    r = random.Random(seed)
    ids, x = [], 1
    for _ in range(n):
        x = (x * 5 + 3) % 61 if r.random() > 0.1 else r.randrange(vocab)
        ids.append(x)
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{n}I", *ids))
    return ids


def read_log(out):
    """OUT/train.jsonl as ([(step, train loss)], [(step, held-out loss)])."""
    train, ev = [], []
    with open(os.path.join(out, "train.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j:
                train.append((j["step"], j["loss"]))
            if "eval_loss" in j:
                ev.append((j["step"], j["eval_loss"]))
    return train, ev


class Checks:
    """The CLI tests' reporting: check() prints ok / FAIL lines, finish() exits 1 after any failure."""

    def __init__(self):
        self.failures = []

    def check(self, ok, what):
        print(("ok: " if ok else "FAIL: ") + what)
        if not ok:
            self.failures.append(what)

    def finish(self):
        if self.failures:
            print(f"{len(self.failures)} failure(s)")
            sys.exit(1)
        print("all passed")


def skip(why):
    """Exit 77 (CTest's skip) with a visible SKIPPED line."""
    print(f"SKIPPED: {why}")
    sys.exit(77)


def run_tool(args, timeout=600):
    """(exit code, stdout, stderr) of a command."""
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def need_tools(*tools):
    """Skip (exit 77) unless every tool is an executable file."""
    for tool in tools:
        if not os.access(tool, os.X_OK):
            skip(f"{tool} not built")


def need_fixture(name):
    """FIX/name, or skip (exit 77) when the fixture is missing."""
    path = os.path.join(FIX, name)
    if not os.path.isdir(path):
        skip(f"fixture {name} not in {FIX}")
    return path
