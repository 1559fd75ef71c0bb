#!/usr/bin/env python3
"""One causal SDPA forward + backward (cuDNN or flash backend) on the 7B layer shape, for Nsight Compute.

usage: sdpa_once.py [--seq 32768] [--backend cudnn|flash] [--names]
Runs a warm-up call, then one forward + backward. With --names, prints the CUDA kernels of the second
call (torch.profiler), so that a profiler's kernel filter can be set from them (bench/gpu/ncu-attn.sh).
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ap = argparse.ArgumentParser()
ap.add_argument("--seq", type=int, default=32768)
ap.add_argument("--heads", type=int, default=28)
ap.add_argument("--kv-heads", type=int, default=4)
ap.add_argument("--dim", type=int, default=128)
ap.add_argument("--backend", default="cudnn", choices=["cudnn", "flash"])
ap.add_argument("--names", action="store_true")
a = ap.parse_args()
be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[a.backend]
torch.manual_seed(0)
S, H, Hkv, D = a.seq, a.heads, a.kv_heads, a.dim
q = (torch.rand(1, H, S, D, device="cuda", dtype=torch.bfloat16) * 4 - 2).requires_grad_()
k = (torch.rand(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
v = (torch.rand(1, Hkv, S, D, device="cuda", dtype=torch.bfloat16) * 2 - 1).requires_grad_()
do = torch.rand(1, H, S, D, device="cuda", dtype=torch.bfloat16) * 2 - 1


def step():
    with sdpa_kernel(be):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    o.backward(do)


step()
torch.cuda.synchronize()
if a.names:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        step()
        torch.cuda.synchronize()
    for e in p.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            print(f"kernel {e.device_time_total / 1e3:10.3f} ms  {e.key}")
else:
    step()
    torch.cuda.synchronize()
