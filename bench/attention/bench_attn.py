#!/usr/bin/env python3
"""Paged flash attention vs PyTorch SDPA (flash and cuDNN backends) on the GPU machine, same run.

Qwen2.5-7B attention layer: 28 query heads, 4 KV heads, head dim 128. Ours: the sequence processed
chunk by chunk (chunk 4096, page 128) against the paged history (bench/attention/oomb-bench-attn).
SDPA: the whole causal sequence in one call, bf16, GQA (enable_gqa when the backend takes it, else
K/V repeated to 28 heads outside the timed region). FLOPs as FlashAttention counts them: causal
forward 2*S^2*H*D, forward+backward 3.5x.

usage: bench_attn.py --bin build-pattn/bin/oomb-bench-attn [--seqs 8192,32768,131072] [--out DIR]
Writes DIR/attn.jsonl and DIR/attn.md (a markdown table) and prints the table.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def flops_fwd(S, H, D):
    return 2.0 * S * S * H * D


def bench_sdpa(S, H, Hkv, D, backend_name, reps):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend_name]
    torch.manual_seed(0)
    dev = "cuda"
    q = (torch.rand(1, H, S, D, device=dev, dtype=torch.bfloat16) * 4 - 2).requires_grad_()
    k0 = torch.rand(1, Hkv, S, D, device=dev, dtype=torch.bfloat16) * 2 - 1
    v0 = torch.rand(1, Hkv, S, D, device=dev, dtype=torch.bfloat16) * 2 - 1
    do = torch.rand(1, H, S, D, device=dev, dtype=torch.bfloat16) * 2 - 1
    gqa = "enable_gqa"
    k = k0.clone().requires_grad_()
    v = v0.clone().requires_grad_()

    def call(q, k, v, gqa_flag):
        with sdpa_kernel(backend):
            if gqa_flag:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    try:
        with torch.no_grad():
            call(q, k, v, True)
        torch.cuda.synchronize()
    except Exception:
        gqa = "repeat_kv"
        k = k0.repeat_interleave(H // Hkv, dim=1).contiguous().requires_grad_()
        v = v0.repeat_interleave(H // Hkv, dim=1).contiguous().requires_grad_()
    use_gqa = gqa == "enable_gqa"

    def fwd():
        with torch.no_grad():
            call(q, k, v, use_gqa)

    def fwdbwd():
        o = call(q, k, v, use_gqa)
        o.backward(do)

    def timeit(fn):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1))
        ts.sort()
        return ts[len(ts) // 2]

    f_ms = timeit(fwd)
    fb_ms = timeit(fwdbwd)
    fl = flops_fwd(S, H, D)
    res = {"impl": "sdpa-" + backend_name, "seq": S, "gqa": gqa, "fwd_ms": round(f_ms, 3), "fwdbwd_ms": round(fb_ms, 3),
           "fwd_tflops": round(fl / f_ms * 1e-9, 1), "fwdbwd_tflops": round(3.5 * fl / fb_ms * 1e-9, 1)}
    del q, k, v, k0, v0, do
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build-pattn/bin/oomb-bench-attn")
    ap.add_argument("--seqs", default="8192,32768,131072")
    ap.add_argument("--heads", type=int, default=28)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--page", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-sdpa", action="store_true")
    a = ap.parse_args()
    seqs = [int(s) for s in a.seqs.split(",")]
    rows = []

    t0 = time.time()
    cmd = [a.bin, "--seq", a.seqs, "--chunk", str(a.chunk), "--page", str(a.page), "--heads", str(a.heads),
           "--kv-heads", str(a.kv_heads), "--dim", str(a.dim), "--reps", str(a.reps)]
    print("running", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(p.stderr)
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            r["impl"] = "oomb-paged"
            rows.append(r)
            print(json.dumps(r), flush=True)
    if p.returncode != 0:
        print("oomb-bench-attn failed with", p.returncode, flush=True)
    print(f"ours: {time.time() - t0:.1f} s", flush=True)

    if not a.skip_sdpa:
        for S in seqs:
            for be in ("flash", "cudnn"):
                t1 = time.time()
                try:
                    r = bench_sdpa(S, a.heads, a.kv_heads, a.dim, be, a.reps)
                except Exception as e:  # a backend that cannot run this shape
                    r = {"impl": "sdpa-" + be, "seq": S, "error": str(e).splitlines()[0][:200] if str(e) else repr(e)}
                rows.append(r)
                print(json.dumps(r), f"({time.time() - t1:.1f} s)", flush=True)

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "attn.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    lines = ["| impl | seq | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | note |", "|---|---|---|---|---|---|---|"]
    for S in seqs:
        for r in rows:
            if r.get("seq") != S:
                continue
            if "error" in r:
                lines.append(f"| {r['impl']} | {S} | - | - | - | - | {r['error']} |")
                continue
            note = r.get("gqa", "")
            if r["impl"] == "oomb-paged":
                note = f"chunk {r['chunk']}, page {r['page']}; bwd {r['bwd_ms']} ms ({r['bwd_tflops']} TFLOP/s, " + ("LSE recomputed" if r.get("lse") == "recompute" else "saved forward LSE") + ")"
            lines.append(f"| {r['impl']} | {S} | {r['fwd_ms']} | {r['fwd_tflops']} | {r['fwdbwd_ms']} | {r['fwdbwd_tflops']} | {note} |")
    table = "\n".join(lines)
    with open(os.path.join(a.out, "attn.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
