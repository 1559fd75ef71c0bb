#!/usr/bin/env python3
"""Our files checked against a real llama.cpp build (issue 14): llama.cpp loads our models, our LoRA
adapter and our merged model and computes the same perplexity as oomb-eval on the same text and
windows, and the files its llama-quantize writes load here with the same perplexity.

The llama.cpp tools come from scripts/build-llama-cpp.sh (the llama.cpp vendored in the pinned
llama-cpp-python sdist, CPU only, cached in BUILD/llama.cpp; `make llama-cpp` or .ci/run builds it).
Found through OOMB_LLAMACPP_DIR (set by CTest: BUILD/llama.cpp/bin). Without them the llama.cpp
parts print a visible SKIPPED line and the test exits 77, after the oomb-only checks below ran.

Scoring: llama-perplexity cuts the ids into floor(n / ctx) windows of ctx tokens, puts BOS first in
each when the vocabulary says add_bos (Qwen2's does not), and scores only the second half of each
window; `oomb-eval --score-second-half` does the same (examples/eval-windows.h). We compare the
mean NLL, which llama-perplexity prints with 6 decimals per chunk under --ppl-output-type 1 (its
"Final estimate" PPL has only 4), to 1e-3 relative. One ubatch per window (-b ctx).

The model: a tiny Qwen2 from oomb-gguf-init (hidden 256 so that the K-quants apply, the Qwen2.5
tokenizer, f32), text: a slice of data/python-docs.txt.gz (~3.5K tokens; windows of 256).

  0. (oomb only, always) --score-second-half means what it says: on one window of 2k ids its NLL
     sum equals the default NLL sum of the first 2k ids (positions 0 .. 2k-2 scored) minus that of
     the first k+1 ids (positions 0 .. k-1): the scored positions are exactly k .. 2k-2, whatever
     the chunking; bad --ctx / too short data named;
  1. baseline: the f32 base alone (and its f16 twin), llama-perplexity == oomb-eval; the same with a
     vocabulary that says add_bos (BOS first: a weak check on this random model, see below);
  a. adapter: oomb-train --trainable lora a few steps -> DIR/adapter.gguf; llama-perplexity --lora
     == oomb-eval --lora (and the adapter moves the NLL well past the tolerance);
  b. merged: oomb-export --lora --out-type f16 (SKIPPED while oomb-export is not built) -> both on
     M.gguf equal each other and the adapter's NLL; also llama-export-lora's merge of our adapter
     loads here with llama.cpp's NLL;
  c. llama-quantize of the f32 base to Q8_0 and Q4_K_M (checked to hold Q8_0 / Q4_K and Q6_K
     tensors): loads in oomb-eval, NLL == llama's; and llama-perplexity on the file's weights
     dequantized by gguf-py into f32 == oomb-eval on the quantized file to 1e-4 (llama.cpp's own
     quantized products round the activations too: that part of the difference is theirs).

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR, OOMB_LLAMACPP_DIR. Exit 0: all passed;
1: a failure; 77 (SKIPPED line): llama.cpp (or a tool, Python package) missing.
"""
import gzip
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import Checks, make_bin, need_tools, run_tool, skip  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
LLAMA = os.environ.get("OOMB_LLAMACPP_DIR") or os.path.join(BIN, "..", "llama.cpp", "bin")
TRAIN, EVAL, INIT, EXPORT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-eval", "oomb-gguf-init", "oomb-export"))
PPL, QUANTIZE, EXPORT_LORA = (os.path.join(LLAMA, t) for t in ("llama-perplexity", "llama-quantize", "llama-export-lora"))
VOCAB = os.path.join(SRC, "models", "qwen2.5-vocab.gguf")
N_VOCAB = 151665  # tokens in models/qwen2.5-vocab.gguf: llama.cpp wants token_embd rows == vocabulary size
CTX = 256
REL = 1e-3        # the agreement asked for (issue 14); never loosened to pass

c = Checks()


def oomb_eval(model, data, lora=None, data_bin=False, extra=(), ctx=CTX, chunk=96, page=32):
    """oomb-eval's JSON result (mean_nll, targets, windows, tokens) or None; stderr."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        js = f.name
    args = [EVAL, "-m", model, "--data-bin" if data_bin else "--data", data, "--ctx", str(ctx), "--chunk", str(chunk),
            "--page", str(page), "--threads", "2", "--json", js] + list(extra)
    if lora:
        args += ["--lora", lora]
    rc, o, e = run_tool(args)
    r = json.load(open(js)) if rc == 0 else None
    os.unlink(js)
    return r, (e or o).strip()[-300:]


def llama_ppl(model, text, lora=None):
    """(mean NLL, chunks) of llama-perplexity --ppl-output-type 1 (the last chunk line's cumulative mean), or None; log."""
    args = [PPL, "-m", model, "-f", text, "-c", str(CTX), "-b", str(CTX), "-t", "2", "--ppl-output-type", "1"]
    if lora:
        args += ["--lora", lora]
    rc, o, e = run_tool(args)
    log = o + e
    lines = re.findall(r"^\s*(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([-0-9.naif]+)\s*$", o, re.M)
    m = re.search(r"calculating perplexity over (\d+) chunks", log)
    if rc != 0 or not lines or not m:  # rc < 0: killed by that signal (e.g. -4 SIGILL: an instruction the CPU lacks)
        return None, f"exit code {rc}, {len(lines)} chunk lines; " + log.strip()[-600:]
    return (float(lines[-1][2]), int(m.group(1))), log


def compare(what, model, text, lora=None, bos=-1):
    """llama-perplexity vs oomb-eval --score-second-half on one file (bos: the BOS id the vocabulary puts
    first, -1: none): returns oomb's mean NLL."""
    ll, log = llama_ppl(model, text, lora)
    ours, err = oomb_eval(model, text, lora, extra=["--score-second-half"])
    c.check(ll is not None, f"{what}: llama-perplexity runs ({'' if ll else log})")
    c.check(ours is not None, f"{what}: oomb-eval --score-second-half runs ({'' if ours else err})")
    if ll is None or ours is None:
        return None
    nll, chunks = ll
    c.check(ours.get("bos") == bos, f"{what}: oomb-eval's BOS {ours.get('bos')} (expected {bos})")
    c.check(chunks == ours["windows"] == ours["tokens"] // CTX,
            f"{what}: the same windows: llama.cpp {chunks} chunks, oomb {ours['windows']} of {ours['tokens']} tokens")
    c.check(ours["targets"] == chunks * (CTX - CTX // 2 - 1), f"{what}: {ours['targets']} scored tokens")
    d = abs(ours["mean_nll"] - nll) / nll
    c.check(d <= REL, f"{what}: mean NLL llama.cpp {nll:.6f} vs oomb-eval {ours['mean_nll']:.6f} (rel. {d:.2e} <= {REL})")
    return ours["mean_nll"]


def check_merge(what, cmd, merged, text, lora_nll):
    """A merge of base + adapter (cmd writes `merged`): llama.cpp == oomb-eval on it, == base + adapter's NLL."""
    rc, o, e = run_tool(cmd)
    c.check(rc == 0, f"{what}: {os.path.basename(cmd[0])} runs {(o + e).strip()[-300:] if rc else ''}")
    nll = compare(what, merged, text) if rc == 0 else None
    if nll:
        d = abs(nll - lora_nll) / lora_nll
        c.check(d <= REL, f"{what}: {nll:.6f} == base + adapter {lora_nll:.6f} in oomb-eval (rel. {d:.2e})")


def check_dequantized(tmp, base, q, qtype, text, nll):
    """llama.cpp multiplies quantized weights with quantized activations (Q8_K blocks of 256 for the
    K-quants, Q8_0 for Q8_0), so its NLL on q differs from exact math by more than f32 rounding. Here
    the same weights dequantized by gguf-py (gguf.quants) into an f32 copy of the base, run through
    llama-perplexity (f32 math), must equal oomb-eval's NLL on the quantized file to 1e-4 (f32
    agreement is ~4e-6): our loading of llama-quantize's file is exact, the rest is llama.cpp's."""
    deq = os.path.join(tmp, f"dequantized-{qtype}.gguf")
    shutil.copyfile(base, deq)
    src = {t.name: t for t in gguf.GGUFReader(q).tensors}
    out = gguf.GGUFReader(deq, "r+")
    for t in out.tensors:
        st = src[t.name]
        t.data[...] = gguf.quants.dequantize(st.data, st.tensor_type).reshape(t.data.shape)
    out.data.flush()
    del out
    ll, log = llama_ppl(deq, text)
    c.check(ll is not None, f"{qtype} dequantized by gguf-py: llama-perplexity runs ({'' if ll else log})")
    if ll:
        d = abs(ll[0] - nll) / nll
        c.check(d <= 1e-4, f"{qtype}: llama.cpp on gguf-py's f32 dequantization {ll[0]:.6f} == oomb-eval on the {qtype} file "
                           f"{nll:.6f} (rel. {d:.2e} <= 1e-4)")


def check_second_half(tmp, base):
    """Part 0: --score-second-half on one window of 2k == sum over 2k ids - sum over k+1 ids."""
    k = 64
    ids = os.path.join(tmp, "ids.bin")
    make_bin(ids, 4 * k, 512, seed=5)
    a, ea = oomb_eval(base, ids, data_bin=True, ctx=2 * k, chunk=24, page=16, extra=["--score-second-half", "--max-tokens", str(2 * k)])
    b, eb = oomb_eval(base, ids, data_bin=True, ctx=2 * k, chunk=40, page=16, extra=["--max-tokens", str(2 * k)])
    s, es = oomb_eval(base, ids, data_bin=True, ctx=k + 1, chunk=k + 1, page=16, extra=["--max-tokens", str(k + 1)])
    c.check(None not in (a, b, s), "second half: three oomb-eval runs" + ("" if None not in (a, b, s) else f" ({ea} {eb} {es})"))
    if None in (a, b, s):
        return
    c.check((a["windows"], a["targets"], b["targets"], s["targets"]) == (1, k - 1, 2 * k - 1, k),
            f"second half: targets {a['targets']} (one window of {2 * k}), {b['targets']}, {s['targets']}")
    sa, sb, ss = (r["mean_nll"] * r["targets"] for r in (a, b, s))
    c.check(abs(sa - (sb - ss)) <= 1e-5 * sb,
            f"second half: NLL sum {sa:.5f} == {sb:.5f} - {ss:.5f} (positions {k} .. {2 * k - 2} exactly)")
    r, e = oomb_eval(base, ids, data_bin=True, ctx=2, chunk=2, page=1, extra=["--score-second-half"])
    c.check(r is None and "--ctx >= 3" in e, f"--score-second-half --ctx 2: refused, named ({e})")
    r, e = oomb_eval(base, ids, data_bin=True, ctx=8 * k, extra=["--score-second-half"])
    c.check(r is None and "fewer than one window of --ctx" in e, f"--score-second-half, data shorter than --ctx: refused, named ({e})")


def make_base(path, vocab, outtype):
    """The tiny Qwen2 (hidden 256: the K-quants apply; tied head) with `vocab`'s tokenizer: (ok, message)."""
    rc, o, e = run_tool([INIT, "--vocab-size", str(N_VOCAB), "--hidden", "256", "--ffn", "512", "--layers", "2",
                         "--heads", "4", "--kv-heads", "2", "--tied", "--init-std", "0.1", "--outtype", outtype,
                         "--vocab", vocab, "--seed", "3", "-o", path])
    return rc == 0, e.strip()[-200:]


def main():
    need_tools(TRAIN, EVAL, INIT)
    try:
        import gguf  # noqa: F401  (llama.cpp's gguf-py: the tensor types of llama-quantize's files)
    except ImportError as e:
        skip(f"{e} (needs gguf)")
    globals()["gguf"] = gguf
    if not os.path.exists(VOCAB):
        skip(f"{VOCAB} missing")
    with tempfile.TemporaryDirectory(prefix="oomb-py-llamacpp-") as tmp:
        base = os.path.join(tmp, "base-f32.gguf")
        ok, msg = make_base(base, VOCAB, "f32")
        c.check(ok, f"oomb-gguf-init: a tiny Qwen2 with the Qwen2.5 tokenizer {msg}")
        if not ok:
            c.finish()
        check_second_half(tmp, base)

        missing = [t for t in (PPL, QUANTIZE, EXPORT_LORA) if not os.access(t, os.X_OK)]
        if missing:
            if c.failures:
                c.finish()
            skip(f"llama.cpp tools not built ({', '.join(missing)}; scripts/build-llama-cpp.sh BUILD_DIR builds them; "
                 f"OOMB_LLAMACPP_DIR={LLAMA}); the oomb-only checks above passed")

        text_all = gzip.open(os.path.join(SRC, "data", "python-docs.txt.gz"), "rt", encoding="utf-8").read()
        text, train_text = os.path.join(tmp, "eval.txt"), os.path.join(tmp, "train.txt")
        # one document: llama.cpp reads <|endoftext|> as plain text (oomb: a document separator, its id);
        # no trailing newline: llama.cpp's -f drops one
        open(text, "w", encoding="utf-8").write(text_all[200000:212000].replace("<|endoftext|>", "\n").rstrip("\n"))
        open(train_text, "w", encoding="utf-8").write(text_all[:60000])

        # 1. baseline: the f32 base alone, and the same weights in f16 (llama.cpp rounds the activations
        # to f16 for f16 weights)
        base_nll = compare("f32 base", base, text)
        base16 = os.path.join(tmp, "base-f16.gguf")
        ok, msg = make_base(base16, VOCAB, "f16")
        c.check(ok, f"oomb-gguf-init --outtype f16 {'' if ok else msg}")
        if ok:
            compare("f16 base", base16, text)

        # the same with a vocabulary that says add_bos (Qwen2.5's does not): BOS first in the text and
        # in every window, as llama-perplexity does
        vocab_bos = os.path.join(tmp, "vocab-add-bos.gguf")
        shutil.copyfile(VOCAB, vocab_bos)
        r = gguf.GGUFReader(vocab_bos, "r+")
        r.fields["tokenizer.ggml.add_bos_token"].parts[-1][0] = True
        bos_id = int(r.fields["tokenizer.ggml.bos_token_id"].parts[-1][0])
        r.data.flush()
        del r
        base_bos = os.path.join(tmp, "base-f32-add-bos.gguf")
        ok, msg = make_base(base_bos, vocab_bos, "f32")
        c.check(ok, f"oomb-gguf-init with an add_bos vocabulary {'' if ok else msg}")
        if ok:
            bos_nll = compare("f32 base, add_bos vocabulary", base_bos, text, bos=bos_id)
            # (a weak check on its own: on this random model BOS first moves the NLL by only ~5e-6
            # relative; the windows themselves are unit-tested in tests/test-eval-windows.cpp)
            if bos_nll and base_nll:
                print(f"note: add_bos vocabulary NLL {bos_nll:.6f} vs {base_nll:.6f} without BOS")

        # a. our adapter in llama.cpp
        out = os.path.join(tmp, "run")
        rc, o, e = run_tool([TRAIN, "-m", base, "--data", train_text, "--ctx", str(CTX), "--chunk", "128", "--page", "32",
                             "--trainable", "lora", "--lora-rank", "8", "--lr", "1e-2", "--warmup", "1", "--steps", "8",
                             "--eval-every", "0", "--eval-seqs", "1", "--save-every", "0", "--threads", "2", "--seed", "7",
                             "--out", out])
        adapter = os.path.join(out, "adapter.gguf")
        c.check(rc == 0 and os.path.exists(adapter), f"oomb-train --trainable lora 8 steps -> adapter.gguf {e.strip()[-300:]}")
        lora_nll = compare("f32 base + our LoRA adapter", base, text, lora=adapter) if rc == 0 else None
        if base_nll and lora_nll:
            c.check(abs(lora_nll - base_nll) > 10 * REL * base_nll,
                    f"the adapter moves the NLL {base_nll:.4f} -> {lora_nll:.4f} (well past the tolerance)")

        # b. merged models: llama.cpp's merge of our adapter loads here; ours (oomb-export) loads there
        if lora_nll:
            m2 = os.path.join(tmp, "merged-by-llama.gguf")
            check_merge("llama-export-lora's merge", [EXPORT_LORA, "-m", base, "--lora", adapter, "-o", m2, "-t", "2"], m2, text, lora_nll)
            if os.access(EXPORT, os.X_OK):
                m = os.path.join(tmp, "merged-f16.gguf")
                check_merge("oomb-export's f16 merge", [EXPORT, "-m", base, "--lora", adapter, "--out-type", "f16", "-o", m], m, text, lora_nll)
            else:
                print(f"SKIPPED: (b) merged model through oomb-export: {EXPORT} not built")

        # c. llama-quantize's files load here
        for qtype in ("Q8_0", "Q4_K_M"):
            q = os.path.join(tmp, f"base-{qtype}.gguf")
            rc, o, e = run_tool([QUANTIZE, base, q, qtype, "2"])
            c.check(rc == 0, f"llama-quantize f32 -> {qtype} {(o + e).strip()[-300:] if rc else ''}")
            if rc == 0:
                types = sorted({gguf.GGMLQuantizationType(t.tensor_type).name for t in gguf.GGUFReader(q).tensors})
                want = {"Q8_0": {"Q8_0"}, "Q4_K_M": {"Q4_K", "Q6_K"}}[qtype]
                c.check(want <= set(types), f"llama-quantize {qtype}: the file holds {types} (wanted {sorted(want)} among them)")
                nll = compare(f"llama-quantize {qtype}", q, text)
                if nll and base_nll:
                    print(f"note: {qtype} NLL {nll:.6f} vs f32 {base_nll:.6f}")
                if nll:
                    check_dequantized(tmp, base, q, qtype, text, nll)
    c.finish()


if __name__ == "__main__":
    main()
