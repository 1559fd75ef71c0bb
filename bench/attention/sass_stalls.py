#!/usr/bin/env python3
"""Summarises Nsight Compute's source page (`ncu -i R --page source --csv --print-source sass`, written by
bench/gpu/ncu-attn.sh ncu_src): the SASS instructions that hold the most warp-state samples (where the warps
wait), the samples by opcode, and the instructions executed. usage: sass_stalls.py FILE.csv [TOP]"""
import csv
import collections
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    lines = open(path, newline='').read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"#"') or l.startswith('"Address"') or 'Source' in l and ',' in l), 0)
    rows = list(csv.reader(lines[start:]))
    head, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    def col(*names):
        for n in names:
            for i, h in enumerate(head):
                if h.strip() == n:
                    return i
        for n in names:
            for i, h in enumerate(head):
                if n.lower() in h.lower():
                    return i
        return None
    c_src, c_addr = col('Source'), col('Address')
    c_all, c_ni = col('Warp Stall Sampling (All Samples)'), col('Warp Stall Sampling (Not-issued Samples)')
    c_ex = col('Instructions Executed')
    print('columns:', head)
    if c_src is None or c_all is None:
        sys.exit('no Source / Warp Stall Sampling column')
    def num(r, c):
        try:
            return float(r[c].replace(',', '')) if c is not None and r[c] else 0.0
        except ValueError:
            return 0.0
    tot = sum(num(r, c_all) for r in body)
    print(f'{len(body)} instructions, {tot:.0f} samples')
    by_op = collections.Counter()
    for r in body:
        by_op[r[c_src].split()[0].lstrip('@!P0123456789T').split('.')[0] if r[c_src].strip() else '?'] += num(r, c_all)
    print('samples by opcode:', ', '.join(f'{k} {v / tot:.1%}' for k, v in by_op.most_common(16)))
    print(f'top {top} instructions (address, % of samples, not-issued %, executed, source):')
    for r in sorted(body, key=lambda r: -num(r, c_all))[:top]:
        print(f'  {r[c_addr] if c_addr is not None else "?":>8} {num(r, c_all) / tot:6.1%} {num(r, c_ni) / tot:6.1%} {num(r, c_ex):10.0f}  {r[c_src][:90]}')


if __name__ == '__main__':
    main()
