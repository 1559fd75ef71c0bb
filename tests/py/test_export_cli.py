#!/usr/bin/env python3
"""oomb-export: a LoRA adapter merged into its base, written as f16 / bf16 / q8_0 / q4_k_m (CPU).

A tiny Qwen2 (oomb-gguf-init: hidden 256, ffn 512, 8 layers, f32, untied; gguf-py adds a small
tokenizer so that the metadata copy is checked on one) and an adapter of oomb-train --trainable
lora (rank 8, alpha 32, 8 steps):

  - oomb-export --out-type f16 of base + adapter: oomb-eval of the merged file equals oomb-eval -m
    base --lora adapter (the same rule, W + alpha/r B A, merged in f32): |dNLL| <= 1e-4 * NLL (f16
    rounding of the merged weights; measured ~1e-7); --out-type f32: <= 1e-5 * NLL;
  - the merged weights equal numpy's W + alpha/r * B @ A (f32 output, 1e-6 relative to max|W|);
  - every output has the base's metadata, values equal, in order (tokenizer included), except
    general.file_type (F16 1, BF16 32, Q8_0 7, Q4_K_M 15) and general.quantization_version (2,
    added for the quantized outputs);
  - per-tensor types (gguf-py reader): 1-D tensors F32; f16/bf16/q8_0: every 2-D weight in that
    type; q4_k_m as llama.cpp's mix, recomputed here: output.weight Q6_K, attn_v and ffn_down Q6_K
    in layers i with i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2 (layers 0, 3, 6, 7 of 8), Q4_K
    otherwise; tied embeddings (no output.weight): token_embd.weight Q6_K;
  - bf16, q8_0 and q4_k_m outputs load and give an NLL close to the f16 one: bf16 and q8_0 within
    1e-3 relative, q4_k_m within 5e-3 (measured ~4e-4);
  - an adapter without adapter.lora.alpha merges with scale 1, as oomb-eval --lora applies it;
  - a Llama base (make_llama; attn_q / attn_k rows permuted in the file): merged f32 / f16 NLL ==
    oomb-eval --lora (1e-5 / 1e-4 relative);
  - a quantized base (the q8_0 output) can be a base again (--out-type f16, no adapter);
  - bad inputs: a missing base or adapter (named), a model given as --lora, an adapter given as
    -m, another architecture's adapter, another shape's adapter, an incomplete pair, a tensor the
    base lacks, an unknown --out-type, a NaN in a base weight (named with the tensor; the previous
    output file is kept and no temporary file is left): exit 1 with a clear message.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0 pass, 1 failure, 77 skipped.
"""
import glob
import os
import re
import shutil
import sys
import subprocess
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import Checks, make_bin, make_llama, need_tools, run_tool, skip  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
TRAIN, EVAL, INIT, EXPORT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-eval", "oomb-gguf-init", "oomb-export"))

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
except ImportError as e:
    skip(f"{e} (needs numpy and gguf)")

N_LAYER = 8
FILE_TYPE = {"f16": 1, "bf16": 32, "q8_0": 7, "q4_k_m": 15, "f32": 0}
WEIGHT_TYPE = {"f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0, "f32": T.F32}


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_types(reader, out_type):
    names = [t.name for t in reader.tensors]
    has_output = "output.weight" in names
    want = {}
    for t in reader.tensors:
        if len(t.shape) < 2:
            want[t.name] = T.F32
        elif out_type != "q4_k_m":
            want[t.name] = WEIGHT_TYPE[out_type]
        elif t.name == "output.weight" or (t.name == "token_embd.weight" and not has_output):
            want[t.name] = T.Q6_K
        elif ".attn_v." in t.name or ".ffn_down." in t.name:
            layer = int(t.name.split(".")[1])
            want[t.name] = T.Q6_K if use_more_bits(layer, N_LAYER) else T.Q4_K
        else:
            want[t.name] = T.Q4_K
    return want


def add_tokenizer(src, dst):
    """src rewritten by gguf-py with a small gpt2-style tokenizer (512 tokens) in its metadata."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=bytes(r.fields["general.architecture"].parts[-1]).decode())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        w.add_key_value(name, f.contents(), vtype, sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"tok{i}" for i in range(512)]); w.add_token_types([1] * 512); w.add_token_merges(["t o", "to k"])
    w.add_eos_token_id(0)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def write_adapter(path, arch, tensors, alpha=32.0):
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_string("general.type", "adapter"); w.add_string("adapter.type", "lora")
    if alpha is not None:
        w.add_float32("adapter.lora.alpha", alpha)
    for name, x in tensors.items():
        w.add_tensor(name, x)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def fields(path):
    r = gguf.GGUFReader(path)
    return [(k, f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")]


def main():
    need_tools(TRAIN, EVAL, INIT, EXPORT)
    c = Checks()
    with tempfile.TemporaryDirectory(prefix="oomb-py-export-") as tmp:
        raw, base = os.path.join(tmp, "raw.gguf"), os.path.join(tmp, "base.gguf")
        rc, _, e = run_tool([INIT, "--vocab-size", "512", "--hidden", "256", "--ffn", "512", "--layers", str(N_LAYER), "--heads", "4",
                             "--kv-heads", "2", "--outtype", "f32", "--untied", "--seed", "3", "-o", raw])
        c.check(rc == 0, f"oomb-gguf-init makes a tiny Qwen2 {e.strip()[-200:]}")
        if rc:
            c.finish()
        add_tokenizer(raw, base)
        data = os.path.join(tmp, "ids.bin")
        make_bin(data, 12000, 512)

        def train(model, run_dir):
            rc, _, e = run_tool([TRAIN, "-m", model, "--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--lr",
                                 "3e-2", "--warmup", "2", "--threads", "2", "--seed", "7", "--trainable", "lora", "--lora-rank",
                                 "8", "--lora-alpha", "32", "--steps", "8", "--save-every", "0", "--eval-every", "0", "--out", run_dir])
            adapter = os.path.join(run_dir, "adapter.gguf")
            c.check(rc == 0 and os.path.exists(adapter), f"oomb-train --trainable lora on {os.path.basename(model)} writes an adapter "
                    f"{e.strip()[-200:]}")
            return adapter if rc == 0 else None

        adapter = train(base, os.path.join(tmp, "run"))
        if adapter is None:
            c.finish()

        def nll(model, *extra):
            rc, o, e = run_tool([EVAL, "-m", model, *extra, "--data-bin", data, "--max-tokens", "512", "--ctx", "64", "--chunk", "24",
                                 "--page", "16", "--threads", "2"])
            m = re.search(r"mean NLL: ([0-9.]+)", o)
            return float(m.group(1)) if rc == 0 and m else None

        base_nll, lora_nll = nll(base), nll(base, "--lora", adapter)
        c.check(None not in (base_nll, lora_nll) and abs(base_nll - lora_nll) > 1e-2,
                f"the adapter changes the NLL ({base_nll} -> {lora_nll})")
        base_fields = fields(base)
        br = gguf.GGUFReader(base)
        out = {}
        for t in ("f32", "f16", "bf16", "q8_0", "q4_k_m"):
            out[t] = os.path.join(tmp, f"merged-{t}.gguf")
            rc, _, e = run_tool([EXPORT, "-m", base, "--lora", adapter, "--out-type", t, "-o", out[t]])
            c.check(rc == 0 and "56 merged" in e, f"oomb-export --out-type {t}: 56 projections merged (rc {rc}) {e.strip()[-300:]}")
            if rc:
                continue
            got = fields(out[t])
            want = [(k, FILE_TYPE[t] if k == "general.file_type" else v) for k, v in base_fields]
            if t in ("q8_0", "q4_k_m") and "general.quantization_version" not in dict(base_fields):
                want.append(("general.quantization_version", 2))
            c.check(got == want, f"{t}: the base's metadata in order, tokenizer included, general.file_type {FILE_TYPE[t]}"
                    + ("" if got == want else f" (differs: {[k for (k, v), (k2, v2) in zip(got, want) if k != k2 or v != v2][:5]}, "
                                              f"{len(got)} vs {len(want)} keys)"))
            r = gguf.GGUFReader(out[t])
            types = {x.name: x.tensor_type for x in r.tensors}
            exp = expected_types(br, t)
            bad = [f"{n} {types.get(n)} != {exp[n].name}" for n in exp if types.get(n) != exp[n]]
            counts = {}
            for v in types.values():
                counts[v.name] = counts.get(v.name, 0) + 1
            c.check(not bad and len(types) == len(exp), f"{t}: per-tensor types as expected {counts} {bad[:4]}")

        # the merge itself, against numpy (f32 output)
        if os.path.exists(out["f32"]):
            ar = gguf.GGUFReader(adapter)
            alpha = float(ar.fields["adapter.lora.alpha"].parts[-1][0])
            ad = {t.name: np.array(t.data, dtype=np.float64) for t in ar.tensors}
            mr = {t.name: np.array(t.data, dtype=np.float64) for t in gguf.GGUFReader(out["f32"]).tensors}
            worst, n = 0.0, 0
            for t in br.tensors:
                W = np.array(t.data, dtype=np.float64)
                if t.name + ".lora_a" in ad:
                    A, B = ad[t.name + ".lora_a"], ad[t.name + ".lora_b"]
                    W = W + alpha / A.shape[0] * (B @ A)
                    n += 1
                worst = max(worst, float(np.max(np.abs(mr[t.name] - W)) / max(float(np.max(np.abs(W))), 1e-30)))
            c.check(n == 56 and worst <= 1e-6, f"f32: merged weights == W + alpha/r * B @ A (numpy), worst {worst:.2e} of max|W|")

        nlls = {t: nll(p) for t, p in out.items() if os.path.exists(p)}
        print(f"  NLL: base {base_nll}, base --lora {lora_nll}, merged {nlls}")
        if lora_nll is not None and nlls.get("f32") is not None and nlls.get("f16") is not None:
            c.check(abs(nlls["f32"] - lora_nll) <= 1e-5 * lora_nll, f"merged f32 NLL {nlls['f32']} == base --lora {lora_nll} (1e-5 rel)")
            c.check(abs(nlls["f16"] - lora_nll) <= 1e-4 * lora_nll, f"merged f16 NLL {nlls['f16']} == base --lora {lora_nll} (1e-4 rel)")
            for t, tol in (("bf16", 1e-3), ("q8_0", 1e-3), ("q4_k_m", 5e-3)):
                v = nlls.get(t)
                c.check(v is not None and abs(v - nlls["f16"]) <= tol * nlls["f16"],
                        f"merged {t} NLL {v} close to the f16 one {nlls['f16']} ({tol:g} rel)")
        else:
            c.check(False, f"NLLs computed: {lora_nll} {nlls}")

        # no adapter.lora.alpha: scale 1 (llama.cpp's rule), as oomb-eval --lora applies it
        a = {t.name: np.array(t.data) for t in gguf.GGUFReader(adapter).tensors}
        no_alpha, merged_na = os.path.join(tmp, "no-alpha.gguf"), os.path.join(tmp, "merged-no-alpha.gguf")
        write_adapter(no_alpha, "qwen2", a, alpha=None)
        rc, _, e = run_tool([EXPORT, "-m", base, "--lora", no_alpha, "--out-type", "f32", "-o", merged_na])
        v, ref = (nll(merged_na) if rc == 0 else None), nll(base, "--lora", no_alpha)
        c.check(None not in (v, ref) and abs(v - ref) <= 1e-5 * ref and abs(v - lora_nll) > 1e-4,
                f"an adapter without adapter.lora.alpha (scale 1): merged NLL {v} == oomb-eval --lora {ref} {e.strip()[-200:]}")

        # a Llama base (attn_q / attn_k rows permuted in the file, the adapter's B rows too): the merge
        # in the file's order means what oomb-eval --lora computes
        llama = os.path.join(tmp, "llama.gguf")
        make_llama(llama)
        ladapter = train(llama, os.path.join(tmp, "run-llama"))
        if ladapter:
            ref = nll(llama, "--lora", ladapter)
            for t, tol in (("f32", 1e-5), ("f16", 1e-4)):
                merged_l = os.path.join(tmp, f"llama-merged-{t}.gguf")
                rc, _, e = run_tool([EXPORT, "-m", llama, "--lora", ladapter, "--out-type", t, "-o", merged_l])
                v = nll(merged_l) if rc == 0 else None
                c.check(rc == 0 and "14 merged" in e and v is not None and ref is not None and abs(v - ref) <= tol * ref,
                        f"llama: merged {t} NLL {v} == oomb-eval --lora {ref} ({tol:g} rel) {e.strip()[-200:]}")

        # a quantized file as the base: dequantized, re-typed
        again = os.path.join(tmp, "again.gguf")
        rc, _, e = run_tool([EXPORT, "-m", out["q8_0"], "--out-type", "f16", "-o", again])
        v = nll(again) if rc == 0 else None
        c.check(rc == 0 and v is not None and abs(v - nlls.get("q8_0", -1)) <= 1e-4 * v,
                f"a Q8_0 base re-typed to f16: NLL {v} == the Q8_0 file's {nlls.get('q8_0')} {e.strip()[-200:]}")

        # (s6 review) a run killed by SIGKILL leaves OUT.tmp.<pid> (no handler runs): the next run
        # writing OUT removes it with a note once that process is gone; a live process's is kept
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale, live = f"{again}.tmp.{dead.pid}", f"{again}.tmp.{os.getpid()}"
        other = os.path.join(tmp, f"other.gguf.tmp.{dead.pid}")  # another output's: not ours to remove
        for f in (stale, live, other):
            with open(f, "wb") as fh:
                fh.write(b"partial")
        rc, _, e = run_tool([EXPORT, "-m", out["q8_0"], "--out-type", "f16", "-o", again])
        c.check(rc == 0 and not os.path.exists(stale) and os.path.exists(live) and os.path.exists(other)
                and f"removed {stale}, left by an interrupted write of process {dead.pid}" in e,
                f"a stale OUT.tmp.<pid> of a dead process removed with a note, a live one's and another output's kept ({e.strip()[-300:]})")
        for f in (live, other):
            os.unlink(f)
        # (2026-12-03) the same clean-up in oomb-gguf-init (one helper, gguf-tools/tool-cli.h)
        small = os.path.join(tmp, "small.gguf")
        stale_init = f"{small}.tmp.{dead.pid}"
        with open(stale_init, "wb") as fh:
            fh.write(b"partial")
        rc, _, e = run_tool([INIT, "--vocab-size", "512", "--hidden", "64", "--ffn", "128", "--layers", "1", "--heads", "4", "--kv-heads", "2",
                             "--outtype", "f32", "--seed", "3", "-o", small])
        c.check(rc == 0 and not os.path.exists(stale_init) and f"oomb-gguf-init: note: removed {stale_init}" in e,
                f"oomb-gguf-init removes a dead process's OUT.tmp.<pid> with a note ({e.strip()[-300:]})")
        # -o naming a folder (a trailing '/') is refused before any work; a '.tmp.<pid>' in it is no output of ours
        folder = os.path.join(tmp, "outdir")
        os.makedirs(folder, exist_ok=True)
        decoy = os.path.join(folder, f".tmp.{dead.pid}")
        with open(decoy, "wb") as fh:
            fh.write(b"x")
        for o_arg in (folder + "/", os.path.join(tmp, "missing") + "/", folder):
            rc, _, e = run_tool([INIT, "--vocab-size", "512", "--hidden", "64", "--ffn", "128", "--layers", "1", "--heads", "4", "--kv-heads", "2",
                                 "--outtype", "f32", "-o", o_arg])
            c.check(rc == 1 and ("ends in '/'" in e or "is a directory" in e) and os.path.exists(decoy),
                    f"oomb-gguf-init -o {o_arg}: refused, nothing removed ({e.strip()[-200:]})")

        # tied embeddings: token_embd.weight takes output.weight's Q6_K
        tied = os.path.join(tmp, "tied.gguf")
        run_tool([INIT, "--vocab-size", "512", "--hidden", "256", "--ffn", "512", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                  "--outtype", "bf16", "--tied", "--seed", "3", "-o", tied])
        tq = os.path.join(tmp, "tied-q4km.gguf")
        rc, _, e = run_tool([EXPORT, "-m", tied, "--out-type", "q4_k_m", "-o", tq])
        types = {x.name: x.tensor_type for x in gguf.GGUFReader(tq).tensors} if rc == 0 else {}
        c.check(rc == 0 and "output.weight" not in types and types.get("token_embd.weight") == T.Q6_K,
                f"tied embeddings: token_embd.weight is Q6_K ({types.get('token_embd.weight')}) {e.strip()[-200:]}")

        # bad inputs
        other_arch, bad_shape, half, extra = (os.path.join(tmp, n + ".gguf") for n in ("llama-ad", "shape-ad", "half-ad", "extra-ad"))
        write_adapter(other_arch, "llama", a)
        s = dict(a)
        s["blk.0.attn_q.weight.lora_a"] = np.zeros((8, 128), np.float32)
        write_adapter(bad_shape, "qwen2", s)
        write_adapter(half, "qwen2", {k: v for k, v in a.items() if k != "blk.1.ffn_up.weight.lora_b"})
        write_adapter(extra, "qwen2", dict(a, **{"blk.9.attn_q.weight.lora_a": a["blk.0.attn_q.weight.lora_a"],
                                                 "blk.9.attn_q.weight.lora_b": a["blk.0.attn_q.weight.lora_b"]}))
        o = os.path.join(tmp, "bad-out.gguf")
        missing = os.path.join(tmp, "none.gguf")
        for args, want in (
                (["-m", missing, "--out-type", "f16"], missing),
                (["-m", base, "--lora", missing, "--out-type", "f16"], missing),
                (["-m", base, "--lora", base, "--out-type", "f16"], "expected 'adapter'"),
                (["-m", adapter, "--out-type", "f16"], "-m takes the base model"),
                (["-m", base, "--lora", other_arch, "--out-type", "f16"], "general.architecture is 'llama' but the base model"),
                (["-m", base, "--lora", bad_shape, "--out-type", "f16"], "do not fit the base's 'blk.0.attn_q.weight'"),
                (["-m", base, "--lora", half, "--out-type", "f16"], "the pair of 'blk.1.ffn_up.weight' lacks its .lora_b"),
                (["-m", base, "--lora", extra, "--out-type", "f16"], "'blk.9.attn_q.weight', which the base model"),
                (["-m", base, "--out-type", "q3_k"], "--out-type"),
                (["-m", base, "--lora", adapter], "--out-type")):
            rc, _, e = run_tool([EXPORT, *args, "-o", o])
            c.check(rc == 1 and want in e and not os.path.exists(o),
                    f"oomb-export {' '.join(os.path.basename(x) for x in args)}: exit 1 naming '{os.path.basename(want)}' ({e.strip()[-200:]})")
        # an output path that cannot be the file: refused before any work, nothing left behind
        for out, want in ((tmp, "is a directory"), ("", "--output: an empty value")):
            rc, _, e = run_tool([EXPORT, "-m", base, "--out-type", "q8_0", "-o", out])
            c.check(rc == 1 and want in e and "->" not in e and not glob.glob(os.path.join(tmp, ".tmp*")),
                    f"oomb-export -o '{out}': exit 1, '{want}', before converting ({e.strip()[-200:]})")
        # a NaN in a base weight: named, the previous output kept, no temporary file left
        nan_base = os.path.join(tmp, "nan.gguf")
        r = gguf.GGUFReader(base)
        w = gguf.GGUFWriter(nan_base, arch="qwen2")
        for t in r.tensors:
            x = np.array(t.data)
            if t.name == "blk.2.ffn_gate.weight":
                x = x.copy(); x[1, 5] = np.nan
            w.add_tensor(t.name, x)
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        with open(o, "wb") as f:
            f.write(b"previous")
        rc, _, e = run_tool([EXPORT, "-m", nan_base, "--out-type", "q4_k_m", "-o", o])
        c.check(rc == 1 and "blk.2.ffn_gate.weight" in e and "row 1" in e and "element 5 is NaN" in e,
                f"a NaN in a base weight: exit 1 naming the tensor, row and element ({e.strip()[-200:]})")
        c.check(open(o, "rb").read() == b"previous" and not glob.glob(o + ".tmp*"),
                "the previous output file is kept and no temporary file is left")
        # oomb-eval of that NaN model: exit 2 with a message (was: "perplexity: -nan", exit 0)
        nan_model = os.path.join(tmp, "nan-model.gguf")  # the base (all metadata) with one NaN weight, patched in place
        shutil.copy(base, nan_model)
        t = next(t for t in gguf.GGUFReader(base).tensors if t.name == "blk.2.ffn_gate.weight")
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        with open(nan_model, "r+b") as f:
            f.seek(t.data_offset + 4 * 5)
            f.write(np.float32(np.nan).tobytes())
        rc, out, e = run_tool([EVAL, "-m", nan_model, "--data-bin", data, "--max-tokens", "256", "--ctx", "64", "--threads", "2"])
        c.check(rc == 2 and "the mean NLL is not finite" in e, f"oomb-eval of a model with a NaN weight: exit 2 ({rc}: {e.strip()[-200:]})")
        # unquantized output refuses them too (was: NaN written as is), and f16 a finite value past its range (was: inf)
        rc, _, e = run_tool([EXPORT, "-m", nan_base, "--out-type", "f16", "-o", o])
        c.check(rc == 1 and "blk.2.ffn_gate.weight" in e and "row 1" in e and "element 5 is NaN" in e and open(o, "rb").read() == b"previous",
                f"a NaN in a base weight, --out-type f16: exit 1 naming it, the previous output kept ({e.strip()[-200:]})")
        big_base = os.path.join(tmp, "big.gguf")
        w = gguf.GGUFWriter(big_base, arch="qwen2")
        for t in r.tensors:
            x = np.array(t.data)
            if t.name == "blk.1.ffn_up.weight":
                x = x.copy(); x[2, 3] = 1e6
            w.add_tensor(t.name, x)
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        rc, _, e = run_tool([EXPORT, "-m", big_base, "--out-type", "f16", "-o", o])
        c.check(rc == 1 and "blk.1.ffn_up.weight" in e and "row 2" in e and "element 3 is 1e+06, beyond F16's range" in e,
                f"a weight of 1e6, --out-type f16: exit 1 naming it ({e.strip()[-200:]})")
        rc, _, e = run_tool([EXPORT, "-m", big_base, "--out-type", "bf16", "-o", o])
        c.check(rc == 0, f"the same weight, --out-type bf16: written ({e.strip()[-200:]})")
    c.finish()


if __name__ == "__main__":
    main()
