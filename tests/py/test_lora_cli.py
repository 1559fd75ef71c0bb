#!/usr/bin/env python3
"""LoRA through the command line (oomb-train --trainable lora, oomb-eval --lora), CPU backend:

  - training a few steps lowers the loss and writes OUT/adapter.gguf (no model.gguf) whose keys and
    tensors are those llama.cpp's llama-adapter.cpp reads: general.type = adapter, adapter.type =
    lora, adapter.lora.alpha (f32), general.architecture = the base's, "<base name>.lora_a" ne
    [n_in, r] / ".lora_b" ne [r, n_out] for every target (read with gguf-py);
  - oomb-eval --lora on the held-out windows equals the run's own last held-out loss (the adapter
    in memory), so the file means what training computed;
  - oomb-eval --lora equals the perplexity of the base with the adapter merged into its weights as
    llama.cpp applies it (W_file + alpha / r * B_file A_file, done here with numpy on a copy of the
    f32 GGUF), for a Qwen2 base and for a Llama base (whose attn_q / attn_k rows are permuted in the
    file: this checks the adapter's B rows are in the file's order);
  - resume equivalence: 6 steps straight == 3 steps, stop, --resume 3 more (identical losses, the
    same adapter bytes);
  - bad values: --lora-rank 0, an unknown target, --lora-* without --trainable lora, --trainable
    lora without -m or --preset, --resume with another rank; oomb-eval --lora with a missing file, a model file,
    another architecture's adapter, another shape's adapter: clear messages, exit 1.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0: all passed; 1: a failure; 77
(skip, with a SKIPPED line): a tool or Python package missing.
"""
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, SRC, make_bin, make_llama, need_tools, read_log, skip  # noqa: E402

TRAIN, EVAL, INIT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-eval", "oomb-gguf-init"))
TARGETS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]


try:
    import numpy as np
    import gguf
except ImportError as e:
    skip(f"{e} (needs numpy and gguf)")
need_tools(TRAIN, EVAL, INIT)

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def run(args, timeout=600):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def field(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[-1]).decode()
    return f.parts[-1][0]


def nll(args):
    if "--max-tokens" not in args:
        args = args + ["--max-tokens", "512"]
    rc, o, e = run([EVAL] + args + ["--ctx", "64", "--chunk", "24", "--page", "16", "--threads", "2"])
    m = re.search(r"mean NLL: ([0-9.]+)", o)
    return (float(m.group(1)) if rc == 0 and m else None), o, e


def check_adapter_file(path, base_path, arch, rank, alpha):
    r, b = gguf.GGUFReader(path), gguf.GGUFReader(base_path)
    check(field(r, "general.type") == "adapter", f"{arch}: general.type = adapter")
    check(field(r, "adapter.type") == "lora", f"{arch}: adapter.type = lora")
    check(field(r, "general.architecture") == arch, f"{arch}: general.architecture = {field(r, 'general.architecture')}")
    fa = r.fields.get("adapter.lora.alpha")
    check(fa is not None and fa.types[0] == gguf.GGUFValueType.FLOAT32 and float(fa.parts[-1][0]) == alpha,
          f"{arch}: adapter.lora.alpha is f32 {alpha}")
    base = {t.name: t for t in b.tensors}
    names = {t.name for t in r.tensors}
    n_layer = int(field(b, f"{arch}.block_count"))
    want = {f"blk.{l}.{t}.weight.lora_{s}" for l in range(n_layer) for t in TARGETS for s in "ab"}
    check(names == want, f"{arch}: the {len(want)} tensors <base name>.lora_a / .lora_b of every block projection ({len(names)})")
    ok = True
    for t in r.tensors:
        if not t.name.endswith(".lora_a"):
            continue
        w = base[t.name[:-7]]
        bt = next(x for x in r.tensors if x.name == t.name[:-1] + "b")
        # llama.cpp: base ne[0] == a ne[0], base ne[1] == b ne[1], a ne[1] == b ne[0]
        ok &= (int(t.shape[0]) == int(w.shape[0]) and int(bt.shape[1]) == int(w.shape[1]) and int(t.shape[1]) == int(bt.shape[0]) == rank
               and t.tensor_type == gguf.GGMLQuantizationType.F32 and bt.tensor_type == gguf.GGMLQuantizationType.F32)
    check(ok, f"{arch}: shapes lora_a ne [n_in, {rank}], lora_b ne [{rank}, n_out] against the base's, F32")


def merge(base_path, adapter_path, out_path):
    """The base with the adapter merged as llama.cpp applies it: W += alpha / r * B A (file order)."""
    shutil.copyfile(base_path, out_path)
    a = gguf.GGUFReader(adapter_path)
    alpha = float(a.fields["adapter.lora.alpha"].parts[-1][0])
    ad = {t.name: np.array(t.data, dtype=np.float64) for t in a.tensors}
    m = gguf.GGUFReader(out_path, "r+")
    n = 0
    for t in m.tensors:
        if t.name + ".lora_a" not in ad:
            continue
        A, B = ad[t.name + ".lora_a"], ad[t.name + ".lora_b"]  # numpy [r, n_in], [n_out, r]
        W = np.array(t.data, dtype=np.float64)
        t.data[...] = (W + alpha / A.shape[0] * (B @ A)).astype(np.float32)
        n += 1
    m.data.flush()
    del m
    return n


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-lora-") as tmp:
        qwen = os.path.join(tmp, "qwen2.gguf")
        rc, o, e = run([INIT, "--vocab-size", "512", "--hidden", "64", "--ffn", "128", "--layers", "2", "--heads", "4",
                        "--kv-heads", "2", "--outtype", "f32", "--seed", "3", "-o", qwen])
        check(rc == 0, f"oomb-gguf-init makes a small Qwen2 {e.strip()[-200:]}")
        llama = os.path.join(tmp, "llama.gguf")
        make_llama(llama)
        data = os.path.join(tmp, "ids.bin")
        make_bin(data, 12000, 512)
        common = ["--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--lr", "3e-2", "--warmup", "2",
                  "--eval-seqs", "4", "--threads", "2", "--seed", "7", "--trainable", "lora", "--lora-rank", "8"]

        # (c) training lowers the loss and writes adapter.gguf in llama.cpp's format; (d) eval == merged
        for arch, model in (("qwen2", qwen), ("llama", llama)):
            out = os.path.join(tmp, "run-" + arch)
            rc, o, e = run([TRAIN, "-m", model] + common + ["--steps", "30", "--eval-every", "10", "--save-every", "0", "--out", out])
            check(rc == 0, f"{arch}: 30 LoRA steps (rc {rc}) {e.strip()[-300:]}")
            if rc:
                continue
            check(re.search(r"\| [0-9.]+M trainable \(lora\)", o) is not None, f"{arch}: the trainable count says lora")
            train, ev = read_log(out)
            losses = [l for _, l in train]
            first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
            check(last < first - 0.1, f"{arch}: training loss falls {first:.3f} -> {last:.3f}")
            check(len(ev) >= 2 and ev[0][0] == 0 and ev[-1][1] < ev[0][1] - 0.1,
                  f"{arch}: held-out loss falls from the base's (step 0) {ev[0][1]:.4f} -> {ev[-1][1]:.4f}" if ev else f"{arch}: eval entries")
            adapter = os.path.join(out, "adapter.gguf")
            check(os.path.exists(adapter) and not os.path.exists(os.path.join(out, "model.gguf")),
                  f"{arch}: the checkpoint is adapter.gguf (no model.gguf)")
            check_adapter_file(adapter, model, arch, 8, 32.0)
            # the file means what training computed: oomb-eval --lora on the held-out windows (the last
            # 5 %, 4 windows of 64) == the run's last held-out loss, computed with the adapter in memory
            # (for Llama this checks the order of B's attn_q / attn_k rows in the file)
            ids = open(data, "rb").read()
            n_ids = len(ids) // 4
            held = os.path.join(tmp, "held.bin")
            open(held, "wb").write(ids[(n_ids - int(n_ids * 5.0 / 100.0)) * 4:])
            held_nll, _, e = nll(["-m", model, "--lora", adapter, "--data-bin", held, "--max-tokens", "256"])
            check(held_nll is not None and ev and abs(held_nll - ev[-1][1]) <= 1e-5 * ev[-1][1],
                  f"{arch}: oomb-eval --lora held-out NLL {held_nll} == the run's last held-out loss {ev[-1][1] if ev else None} {e.strip()[-200:]}")
            merged = os.path.join(tmp, f"merged-{arch}.gguf")
            n = merge(model, adapter, merged)
            check(n == 14, f"{arch}: merged {n} projections")
            base_nll, _, _ = nll(["-m", model, "--data-bin", data])
            lora_nll, o, e = nll(["-m", model, "--lora", adapter, "--data-bin", data])
            merged_nll, _, e2 = nll(["-m", merged, "--data-bin", data])
            check(lora_nll is not None and "adapter: " in o and "rank 8, alpha 32" in o, f"{arch}: oomb-eval --lora runs {e.strip()[-200:]}")
            if None not in (base_nll, lora_nll, merged_nll):
                check(abs(lora_nll - merged_nll) <= 1e-5 * merged_nll,
                      f"{arch}: oomb-eval --lora NLL {lora_nll:.6f} == merged model's {merged_nll:.6f} (base {base_nll:.6f})")
                check(abs(lora_nll - base_nll) > 1e-2, f"{arch}: the adapter changes the NLL ({base_nll:.4f} -> {lora_nll:.4f})")
            else:
                check(False, f"{arch}: perplexities {base_nll} {lora_nll} {merged_nll} {e2.strip()[-200:]}")

        # (e) resume equivalence: 6 straight vs 3 + resume 3
        A, B = os.path.join(tmp, "A"), os.path.join(tmp, "B")
        args = [TRAIN, "-m", qwen] + common + ["--steps", "6", "--save-every", "2", "--eval-every", "3"]
        rc1, _, e1 = run(args + ["--out", A])
        rc2, _, e2 = run(args + ["--out", B, "--stop-after", "3"])
        rc3, o3, e3 = run(args + ["--out", B, "--resume"])
        check(rc1 == 0 and rc2 == 0 and rc3 == 0 and "resume: from step 3" in o3,
              f"straight, stop and resume runs {e1.strip()[-150:]} {e2.strip()[-150:]} {e3.strip()[-150:]}")
        if rc1 == 0 and rc3 == 0:
            la, lb = read_log(A), read_log(B)
            check(la == lb and len(la[0]) == 6, f"resume: identical train and eval losses, straight vs resumed ({la[0][-1]} {lb[0][-1]})")
            check(open(os.path.join(A, "adapter.gguf"), "rb").read() == open(os.path.join(B, "adapter.gguf"), "rb").read(),
                  "resume: the same adapter.gguf bytes")
            rc, o, e = run([a if a != "8" else "4" for a in args] + ["--out", B, "--resume", "--steps", "8"])
            check(rc == 1 and "rank 8" in e and "--lora-rank" in e, f"--resume with another --lora-rank: refused ({e.strip()[-200:]})")

        # (f) bad values
        base_cmd = [TRAIN, "-m", qwen, "--data-bin", data, "--ctx", "64", "--steps", "1", "--out", os.path.join(tmp, "bad")]
        for extra, want in (
                (["--trainable", "lora", "--lora-rank", "0"], "--lora-rank"),
                (["--trainable", "lora", "--lora-targets", "q,x"], "unknown target 'x'"),
                (["--trainable", "lora", "--lora-targets", "q,q"], "given twice"),
                (["--trainable", "lora", "--lora-alpha", "inf"], "--lora-alpha"),
                (["--lora-rank", "8"], "--lora-rank needs --trainable lora"),
                (["--trainable", "linear", "--lora-targets", "q"], "--lora-targets needs --trainable lora"),
                (["--trainable", "bogus"], "all, linear or lora")):
            rc, o, e = run(base_cmd + extra)
            check(rc == 1 and want in e, f"oomb-train {' '.join(extra)}: exit 1 naming '{want}' ({e.strip()[-160:]})")
        # a --preset is a (random) base since bench/lora; neither -m nor --preset is refused
        rc, o, e = run([TRAIN, "--data-bin", data, "--trainable", "lora", "--out", os.path.join(tmp, "bad")])
        check(rc == 1 and "-m BASE.gguf" in e, f"--trainable lora without -m or --preset: refused ({e.strip()[-160:]})")
        qa = os.path.join(tmp, "run-qwen2", "adapter.gguf")
        other = os.path.join(tmp, "qwen2-32.gguf")
        run([INIT, "--vocab-size", "512", "--hidden", "32", "--ffn", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2",
             "--outtype", "f32", "--seed", "3", "-o", other])
        for m, ad, want in ((qwen, os.path.join(tmp, "none.gguf"), "no such file"),
                            (qwen, qwen, "general.type is 'model', expected 'adapter'"),
                            (llama, qa, "general.architecture is 'qwen2' but the base model is 'llama'"),
                            (other, qa, "do not fit 'blk.0.attn_q.weight'")):
            rc, o, e = run([EVAL, "-m", m, "--lora", ad, "--data-bin", data, "--max-tokens", "64"])
            check(rc == 1 and want in e, f"oomb-eval --lora {os.path.basename(ad)} on {os.path.basename(m)}: names '{want}' ({e.strip()[-200:]})")

    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
