"""Training data and logs for the CLI tests (test_train_cli.py, test_lora_cli.py, test_export_cli.py): a learnable id
stream, a small random Llama GGUF."""
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


def make_llama(path, seed=4):
    """A small random Llama GGUF (llama.* keys, f32, untied, 2 layers, hidden 64), written with gguf-py."""
    import numpy as np
    import gguf

    rng = np.random.default_rng(seed)
    V, E, F, L, H, KV, D = 512, 64, 128, 2, 4, 2, 16
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(L); w.add_context_length(2048); w.add_embedding_length(E); w.add_feed_forward_length(F)
    w.add_head_count(H); w.add_head_count_kv(KV); w.add_rope_freq_base(10000.0); w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V); w.add_rope_dimension_count(D)
    t = lambda *shape: (rng.standard_normal(shape) * 0.05).astype(np.float32)
    w.add_tensor("token_embd.weight", t(V, E))
    for l in range(L):
        b = f"blk.{l}."
        w.add_tensor(b + "attn_norm.weight", np.ones(E, np.float32))
        w.add_tensor(b + "attn_q.weight", t(H * D, E))
        w.add_tensor(b + "attn_k.weight", t(KV * D, E))
        w.add_tensor(b + "attn_v.weight", t(KV * D, E))
        w.add_tensor(b + "attn_output.weight", t(E, H * D))
        w.add_tensor(b + "ffn_norm.weight", np.ones(E, np.float32))
        w.add_tensor(b + "ffn_gate.weight", t(F, E))
        w.add_tensor(b + "ffn_up.weight", t(F, E))
        w.add_tensor(b + "ffn_down.weight", t(E, F))
    w.add_tensor("output_norm.weight", np.ones(E, np.float32))
    w.add_tensor("output.weight", t(V, E))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def need_modules(*names):
    """The named Python modules, imported; skip (exit 77) when one is missing."""
    import importlib
    try:
        return [importlib.import_module(n) for n in names]
    except ImportError as e:
        skip(f"{e} (needs {', '.join(names)})")


def llama_and_ids(tmp, n_ids, seed=4):
    """(tmp/llama.gguf, tmp/ids.bin): make_llama's base and a make_bin stream of n_ids ids of its 512-token vocabulary."""
    base, data = os.path.join(tmp, "llama.gguf"), os.path.join(tmp, "ids.bin")
    make_llama(base, seed)
    make_bin(data, n_ids, 512)
    return base, data


def need_fixture(name):
    """FIX/name, or skip (exit 77) when the fixture is missing."""
    path = os.path.join(FIX, name)
    if not os.path.isdir(path):
        skip(f"fixture {name} not in {FIX}")
    return path


def mini_f32_gguf(convert, tmp, name="mini.gguf"):
    """The qwen2-mini fixture as an f32 GGUF in tmp (oomb-convert-hf); exits with a FAIL line when the conversion fails."""
    path = os.path.join(tmp, name)
    rc, out, err = run_tool([convert, need_fixture("qwen2-mini"), "--outtype", "f32", "-o", path])
    if rc != 0:
        sys.exit(f"FAIL: oomb-convert-hf: {out}{err}")
    return path
