"""HF baseline for the SmolLM2 H200 run (bench/realmodel/h200-smollm2.sh): LlamaForCausalLM with
SmolLM2-135M's shapes (random weights: the speed and memory depend only on the shapes), full
fine-tune, bf16, SDPA attention, gradient checkpointing, AdamW; the same call as our run.
Usage: python3 hf_smollm2.py SEQ [STEPS] [ROPE_THETA]   -> one JSON line (median step of STEPS after one warm-up)
"""
import json, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM

T = int(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
theta = float(sys.argv[3]) if len(sys.argv) > 3 else 1e6
res = dict(model="smollm2-135m", mode="full", seq=T, rope_theta=theta)
try:
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rms_norm_eps=1e-5,
                      max_position_embeddings=max(T, 8192), rope_theta=theta, use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, cfg.vocab_size, (1, T), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for s in range(steps + 1):
        torch.cuda.synchronize(); t0 = time.time()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); times.append(time.time() - t0)
        del out
    st = sorted(times[1:])[len(times[1:]) // 2]
    res.update(status="ok", step_s=st, tok_per_s=T / st, peak_gib=torch.cuda.max_memory_allocated() / 2**30)
except torch.OutOfMemoryError:
    res.update(status="oom", peak_gib=torch.cuda.max_memory_allocated() / 2**30)
except Exception as e:
    res.update(status="error", error=repr(e)[:300])
print(json.dumps(res), flush=True)
