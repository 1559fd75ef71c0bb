#!/usr/bin/env python3
"""Real-model parity: SmolLM2-135M-Instruct's logits from our forward equal HF transformers'
LlamaForCausalLM's (CPU, float64) on the same weights, to 1e-4 relative, on a few hundred tokens
of real text (the shipped documentation data).

The weights are the GGUF's (Q4_1 / Q8_0), dequantized by gguf-py (`gguf.quants.dequantize`); the
q/k rows un-permuted as llama.cpp's converter permuted them (models/llama-layout.h). Our side:
`oomb-train -m GGUF --tokens IDS --dump-logits L` twice: one chunk over all T tokens (every
position), and chunks of 128 over pages of 48 (the last chunk's logits, after the earlier chunks'
KV through the page table). Error measure: max |ours - HF| / max |HF| over each compared block,
and the same per position (the worst position).

Skipped (exit 77, a SKIPPED line) when the GGUF is not in the cache (tests/py/smollm2_cache.py:
$OOMB_SMOLLM2_GGUF, else models/smollm2/; `scripts/fetch-smollm2.sh` fills it), or when torch,
transformers or gguf cannot be imported, or oomb-train / oomb-tokenize are not built.
"""
import gzip
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from smollm2_cache import find_gguf  # noqa: E402

BIN = os.environ.get("OOMB_BIN_DIR", "build/bin")
SRC = os.environ.get("OOMB_SOURCE_DIR", os.path.join(HERE, "..", ".."))
N_TOKENS = 320
TOL = 1e-4
# CUDA dumps (bench/realmodel/h200-smollm2.sh, made on the GPU machine from the same ids): compared
# with the same HF float64 reference at the bf16 tolerance of the CUDA tests (issue 5: 3e-2)
CUDA_DUMPS = os.environ.get("OOMB_SMOLLM2_CUDA_DUMPS", "")
TOL_BF16 = 3e-2


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(77)


try:
    import numpy as np
    import torch
    import transformers
    import gguf
    from gguf.quants import dequantize
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    skip(f"{e} (the parity test needs numpy, torch, transformers, gguf, safetensors)")

GGUF = find_gguf(SRC)
if GGUF is None:
    skip("SmolLM2-135M-Instruct GGUF not in the cache (set $OOMB_SMOLLM2_GGUF or run scripts/fetch-smollm2.sh)")
for tool in ("oomb-train", "oomb-tokenize"):
    if not os.access(os.path.join(BIN, tool), os.X_OK):
        skip(f"{BIN}/{tool} not built")


def field(r, key):
    return r.fields[key].contents()


def unpermute(w, n_head):
    # inverse of llama.cpp's w.reshape(n_head, 2, hd/2, n_in).swapaxes(1, 2).reshape(n_out, n_in)
    n_out, n_in = w.shape
    return w.reshape(n_head, n_out // n_head // 2, 2, n_in).swapaxes(1, 2).reshape(n_out, n_in)


def hf_model(path):
    r = gguf.GGUFReader(path)
    assert field(r, "general.architecture") == "llama"
    n_layer = int(field(r, "llama.block_count"))
    n_head, n_kv = int(field(r, "llama.attention.head_count")), int(field(r, "llama.attention.head_count_kv"))
    n_embd = int(field(r, "llama.embedding_length"))
    w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(x) for x in reversed(t.shape)])
         for t in r.tensors}
    tied = "output.weight" not in w
    cfg = transformers.LlamaConfig(
        vocab_size=int(field(r, "llama.vocab_size")), hidden_size=n_embd,
        intermediate_size=int(field(r, "llama.feed_forward_length")), num_hidden_layers=n_layer,
        num_attention_heads=n_head, num_key_value_heads=n_kv, head_dim=n_embd // n_head,
        rms_norm_eps=float(field(r, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(field(r, "llama.rope.freq_base")), max_position_embeddings=int(field(r, "llama.context_length")),
        tie_word_embeddings=tied, attention_bias=False, mlp_bias=False, hidden_act="silu")
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": float(field(r, "llama.rope.freq_base"))}
    sd = {"model.embed_tokens.weight": w["token_embd.weight"], "model.norm.weight": w["output_norm.weight"]}
    sd["lm_head.weight"] = w["token_embd.weight"] if tied else w["output.weight"]
    for i in range(n_layer):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        sd[h + "input_layernorm.weight"] = w[b + "attn_norm.weight"]
        sd[h + "post_attention_layernorm.weight"] = w[b + "ffn_norm.weight"]
        sd[h + "self_attn.q_proj.weight"] = unpermute(w[b + "attn_q.weight"], n_head)
        sd[h + "self_attn.k_proj.weight"] = unpermute(w[b + "attn_k.weight"], n_kv)
        sd[h + "self_attn.v_proj.weight"] = w[b + "attn_v.weight"]
        sd[h + "self_attn.o_proj.weight"] = w[b + "attn_output.weight"]
        sd[h + "mlp.gate_proj.weight"] = w[b + "ffn_gate.weight"]
        sd[h + "mlp.up_proj.weight"] = w[b + "ffn_up.weight"]
        sd[h + "mlp.down_proj.weight"] = w[b + "ffn_down.weight"]
    m = transformers.LlamaForCausalLM(cfg).to(torch.float64).eval()
    missing, unexpected = m.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    if tied:
        m.tie_weights()
    return m


def real_text_ids(tmp):
    # a document from the middle of the shipped text (real prose and code)
    with gzip.open(os.path.join(SRC, "data", "python-docs.txt.gz"), "rt", encoding="utf-8") as f:
        text = f.read(400_000)
    text = text[200_000:200_000 + 4000]
    path = os.path.join(tmp, "text.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    out = subprocess.run([os.path.join(BIN, "oomb-tokenize"), "-m", GGUF, "-f", path], capture_output=True, check=True)
    ids = [int(x) for x in out.stdout.split()]
    if len(ids) < N_TOKENS:
        sys.exit(f"FAIL: the text gave only {len(ids)} tokens")
    return np.array(ids[:N_TOKENS], dtype=np.int32)


def ours(tmp, ids, chunk, page):
    tok = os.path.join(tmp, "ids.safetensors")
    save_file({"input_ids": ids}, tok)
    out = os.path.join(tmp, f"logits-{chunk}.safetensors")
    r = subprocess.run([os.path.join(BIN, "oomb-train"), "-m", GGUF, "--tokens", tok, "--dump-logits", out,
                        "--chunk", str(chunk), "--page", str(page)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: oomb-train --dump-logits exit {r.returncode}:\n{r.stdout}{r.stderr}")
    print(r.stdout.strip())
    from safetensors import safe_open
    with safe_open(out, "np") as f:
        p0 = int(f.metadata()["first_position"])
    return p0, load_file(out)["logits"].astype(np.float64)


def compare(name, got, ref, tol=TOL):
    err = np.abs(got - ref)
    rel = err.max() / np.abs(ref).max()
    per_pos = (err.max(axis=1) / np.abs(ref).max(axis=1)).max()
    argmax_same = (got.argmax(axis=1) == ref.argmax(axis=1)).mean()
    ok = rel <= tol and per_pos <= tol
    print(f"{name}: {got.shape[0]} positions, max|d| {err.max():.3e}, max|d|/max|HF| {rel:.3e}, worst position "
          f"{per_pos:.3e} (tol {tol:g}); same argmax {100 * argmax_same:.1f}% -> {'ok' if ok else 'FAIL'}")
    return ok


def compare_cuda_dumps(ids, ref):
    """The CUDA backend's dumps of the same ids (OOMB_SMOLLM2_CUDA_DUMPS=DIR holding cuda-<chunk>.safetensors
    with their ids): HF float64 vs CUDA at the bf16 tolerance."""
    ok, n = True, 0
    for name in sorted(os.listdir(CUDA_DUMPS)):
        if not (name.startswith("cuda-") and name.endswith(".safetensors")):
            continue
        path = os.path.join(CUDA_DUMPS, name)
        from safetensors import safe_open
        with safe_open(path, "np") as f:
            p0 = int(f.metadata()["first_position"])
        got = load_file(path)["logits"].astype(np.float64)
        p1 = p0 + got.shape[0]  # a dump may be one part of a longer one (the GPU machine splits big files)
        if p0 < 0 or p1 > len(ids) or got.shape[1] != ref.shape[1]:
            sys.exit(f"FAIL: {name}: positions from {p0}, shape {got.shape}: not a dump of these {len(ids)} ids")
        ok &= compare(f"CUDA {name} (positions {p0}..{p1 - 1})", got, ref[p0:p1], TOL_BF16)
        n += 1
    if n == 0:
        sys.exit(f"FAIL: OOMB_SMOLLM2_CUDA_DUMPS={CUDA_DUMPS} holds no cuda-*.safetensors")
    return ok


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    with tempfile.TemporaryDirectory(prefix="oomb-py-smollm2-parity-") as tmp:
        ids = real_text_ids(tmp)
        T = len(ids)
        with torch.no_grad():
            ref = hf_model(GGUF)(torch.from_numpy(ids.astype(np.int64))[None]).logits[0].numpy()
        ok = True
        p0, got = ours(tmp, ids, T, 128)
        if p0 != 0 or got.shape != ref.shape:
            sys.exit(f"FAIL: one chunk: positions from {p0}, shape {got.shape}, expected 0 and {ref.shape}")
        ok &= compare("one chunk", got, ref)
        p0, got = ours(tmp, ids, 128, 48)
        if p0 != (T - 1) // 128 * 128 or got.shape != (T - p0, ref.shape[1]):
            sys.exit(f"FAIL: chunks of 128: positions from {p0}, shape {got.shape}")
        ok &= compare(f"chunks of 128, page 48 (positions {p0}..{T - 1})", got, ref[p0:])
        if CUDA_DUMPS:
            ok &= compare_cuda_dumps(ids, ref)
    if not ok:
        sys.exit("FAIL: SmolLM2 logits differ from HF transformers' beyond the tolerance")
    print("ok: SmolLM2-135M logits match HF transformers")


if __name__ == "__main__":
    main()
