#!/usr/bin/env python3
"""Summarises bench/memory/run.sh's JSON lines: a table per context length and least-squares fits
of peak RSS (and of the KV cache bytes) against tokens, against the expected KV + KV-gradient bytes
per token (n_layer * n_head_kv * head_dim * 16: K and V in f32 plus their f32 gradients)."""
import json
import sys

MiB = 1024.0 * 1024.0


def fit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    res = max(abs(y - (a + b * x)) for x, y in zip(xs, ys))
    return a, b, res


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    rows.sort(key=lambda r: r["ctx"])
    print("| context | step s | tokens/s | peak RSS MiB | KV+KV-grad MiB | arena fwd / fwd+bwd MiB | weights+grads MiB | peak RSS - KV MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['ctx']} | {r['step_s']:.1f} | {r['tokens_per_s']:.0f} | {r['peak_rss'] / MiB:.1f} | {r['kv_cache_bytes'] / MiB:.2f} | "
              f"{r['arena_fwd_bytes'] / MiB:.2f} / {r['arena_fwdbwd_bytes'] / MiB:.2f} | {(r['weights_bytes'] + r['grads_bytes']) / MiB:.2f} | "
              f"{(r['peak_rss'] - r['kv_cache_bytes']) / MiB:.1f} |")
    if len(rows) < 2:
        return
    xs = [r["ctx"] for r in rows]
    exp = rows[0]["kv_bytes_per_token_expected"]
    a, b, res = fit(xs, [r["peak_rss"] for r in rows])
    ak, bk, _ = fit(xs, [r["kv_cache_bytes"] for r in rows])
    arenas = sorted({(r["arena_fwd_bytes"], r["arena_fwdbwd_bytes"]) for r in rows})
    print()
    print(f"expected KV + KV-gradient bytes per token: {exp} (n_layer {rows[0]['n_layer']} x n_head_kv {rows[0]['n_head_kv']} x head_dim {rows[0]['head_dim']} x 16)")
    print(f"KV cache allocation fit: {bk:.1f} bytes/token")
    print(f"peak RSS fit: {b:.1f} bytes/token (x{b / exp:.3f} the expected), intercept {a / MiB:.1f} MiB, largest residual {res / MiB:.2f} MiB")
    print(f"  excess over KV + KV-grad: {b - exp:+.1f} bytes/token (the token ids themselves are 4 bytes/token)")
    print(f"arena bytes planned for the chunk graphs (fwd, fwd+bwd) at every length: {arenas}"
          + (" (constant)" if len(arenas) == 1 else " (NOT constant)"))


if __name__ == "__main__":
    main()
