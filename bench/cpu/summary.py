#!/usr/bin/env python3
"""Summarises bench/cpu/run.sh's JSON lines: median seconds per step per implementation, tokens/s,
and the ratio of ggml-oomb's throughput to PyTorch's (HF, SDPA attention), from the same run."""
import json
import sys


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    labels = []
    for r in rows:
        if r["label"] not in labels:
            labels.append(r["label"])
    med, best = {}, {}
    print("| implementation | runs (s/step) | median s/step | tokens/s (median) | best s/step | loss | grad norm |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for lab in labels:
        rs = [r for r in rows if r["label"] == lab]
        secs = [r["median_s"] for r in rs]
        m = median(secs)
        med[lab] = m
        ctx = rs[0]["ctx"]
        best[lab] = min(secs)
        print(f"| {lab} | {', '.join('%.3f' % s for s in secs)} | {m:.3f} | {ctx / m:.0f} | {min(secs):.3f} | {rs[0]['loss']:.6f} | {rs[0]['grad_norm']:.6f} |")
    ref = next((l for l in labels if l.startswith("pytorch hf sdpa")), None)
    if ref:
        print()
        for lab in labels:
            if lab.startswith("ggml-oomb"):
                print(f"{lab} / {ref} throughput: {med[ref] / med[lab]:.3f}x (medians), {best[ref] / best[lab]:.3f}x (best runs)")
    loads = [r["loadavg_before"] for r in rows]
    print(f"\nload average before the runs: {min(loads):.2f} .. {max(loads):.2f} (2 cores)")


if __name__ == "__main__":
    main()
