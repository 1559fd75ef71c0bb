#!/usr/bin/env python3
"""PyTorch (CPU) side of the training-throughput comparison (bench/cpu/run.sh).

One training step = forward + backward of the mean next-token cross-entropy over one sequence of
--ctx tokens (batch 1), every parameter requiring grad, no optimizer update: what
`oomb-bench-train` times. The model is HF transformers' Qwen2ForCausalLM built from the fixture's
config.json with the fixture's weights in float32 (--impl hf, attention through PyTorch SDPA, or
eager attention with --attn eager), or, when transformers is not installed, a plain PyTorch
implementation of the same model (--impl plain). The token ids use the formula of
bench/bench-common.cpp, so the losses of both implementations can be compared.

Prints one JSON line: per-rep seconds, median, tokens/s, loss, gradient norm.
"""
import argparse
import json
import math
import os
import sys
import time


def make_ids(n, vocab):
    return [((i * 2654435761 + 12345) % (1 << 32)) % vocab for i in range(n)]


def load_state(folder, torch):
    from safetensors.torch import load_file
    sd = load_file(os.path.join(folder, "model.safetensors"))
    return {k: v.to(torch.float32) for k, v in sd.items()}


# ---- a straightforward PyTorch Qwen2 (used when transformers is missing, or with --impl plain) ----
def build_plain(cfg, sd, torch, attn):
    import torch.nn.functional as F
    H, Hkv, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    D = E // H
    L = cfg["num_hidden_layers"]
    theta = cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 1e6)
    eps = cfg["rms_norm_eps"]
    P = {k: torch.nn.Parameter(v.clone()) for k, v in sd.items()}
    if "lm_head.weight" not in P:
        P["lm_head.weight"] = P["model.embed_tokens.weight"]

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x, cos, sin):  # NEOX: rotate halves
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos + torch.cat((-x2, x1), -1) * sin

    def forward(ids):
        T = ids.shape[1]
        inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        fr = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        emb = torch.cat((fr, fr), -1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = F.embedding(ids, P["model.embed_tokens.weight"])
        for l in range(L):
            p = f"model.layers.{l}."
            h = rms(x, P[p + "input_layernorm.weight"])
            q = F.linear(h, P[p + "self_attn.q_proj.weight"], P[p + "self_attn.q_proj.bias"]).view(1, T, H, D).transpose(1, 2)
            k = F.linear(h, P[p + "self_attn.k_proj.weight"], P[p + "self_attn.k_proj.bias"]).view(1, T, Hkv, D).transpose(1, 2)
            v = F.linear(h, P[p + "self_attn.v_proj.weight"], P[p + "self_attn.v_proj.bias"]).view(1, T, Hkv, D).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            k = k.repeat_interleave(H // Hkv, 1)
            v = v.repeat_interleave(H // Hkv, 1)
            if attn == "sdpa":
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
                s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
                a = s.softmax(-1) @ v
            a = a.transpose(1, 2).reshape(1, T, E)
            x = x + F.linear(a, P[p + "self_attn.o_proj.weight"])
            h = rms(x, P[p + "post_attention_layernorm.weight"])
            f = F.silu(F.linear(h, P[p + "mlp.gate_proj.weight"])) * F.linear(h, P[p + "mlp.up_proj.weight"])
            x = x + F.linear(f, P[p + "mlp.down_proj.weight"])
        x = rms(x, P["model.norm.weight"])
        logits = F.linear(x, P["lm_head.weight"])
        return F.cross_entropy(logits[0, :-1], ids[0, 1:])

    params = list({id(p): p for p in P.values()}.values())
    return forward, params


def build_hf(folder, sd, torch, attn):
    import transformers
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config.from_pretrained(folder)
    cfg._attn_implementation = attn
    model = Qwen2ForCausalLM(cfg).to(torch.float32)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]  # tied
    if missing or unexpected:
        raise SystemExit(f"weights do not match the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.train()

    def forward(ids):
        return model(input_ids=ids, labels=ids, use_cache=False).loss

    return forward, [p for p in model.parameters()], transformers.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture", required=True, help="HF model folder (config.json, model.safetensors)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--impl", choices=["auto", "hf", "plain"], default="auto")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    a = ap.parse_args()

    import torch
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    sd = load_state(a.fixture, torch)
    cfg = json.load(open(os.path.join(a.fixture, "config.json")))
    impl, hf_version = a.impl, None
    if impl == "auto":
        try:
            import transformers  # noqa: F401
            impl = "hf"
        except ImportError:
            impl = "plain"
    if impl == "hf":
        forward, params, hf_version = build_hf(a.fixture, sd, torch, a.attn)
    else:
        forward, params = build_plain(cfg, sd, torch, a.attn)

    ids = torch.tensor([make_ids(a.ctx, cfg["vocab_size"])], dtype=torch.long)
    secs = []
    loss = None
    for r in range(a.warmup + a.reps):
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        loss = forward(ids)
        loss.backward()
        dt = time.perf_counter() - t0
        print(f"step {r}: {dt:.3f} s ({'warmup' if r < a.warmup else 'timed'})", file=sys.stderr)
        if r >= a.warmup:
            secs.append(dt)
    gn = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None))
    s = sorted(secs)
    med = s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])
    out = {
        "impl": f"pytorch-{impl}" + (f"-{a.attn}"), "torch": torch.__version__, "transformers": hf_version,
        "ctx": a.ctx, "threads": torch.get_num_threads(), "step_s": secs, "median_s": med,
        "tokens_per_s": a.ctx / med, "loss": loss.item(), "grad_norm": gn,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
