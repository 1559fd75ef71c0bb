#!/usr/bin/env python3
"""Tokenizer throughput: ggml-oomb's Qwen2 BPE (oomb-tokenize) against HF `tokenizers` on the
same >= 20 MB of real text, in the same run, and a check that both give identical ids.

Text: the reStructuredText sources of the Python 3.11 documentation (Debian package python3.11-doc,
/usr/share/doc/python3.11/html/_sources) plus the Python standard library sources
(/usr/lib/python3.11/**/*.py), one document per file, until --mb megabytes.

    python3 bench/tokenizer/bench.py [--bin build/bin] [--mb 20] [--threads N]

Times only encoding (not loading the tokenizer or reading files). Single-thread numbers are the
per-core comparison; HF's encode_batch and our --threads use several cores.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def corpus(limit_bytes):
    files = sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/**/*.txt", recursive=True))
    files += sorted(glob.glob("/usr/lib/python3.11/**/*.py", recursive=True))
    docs, total = [], 0
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                s = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        if not s:
            continue
        docs.append(s)
        total += len(s.encode())
        if total >= limit_bytes:
            break
    return docs, total


def run_ours(tool, vocab, path, threads):
    r = subprocess.run([tool, "-m", vocab, "-f", path, "--jsonl", "--stats", "-t", str(threads)], capture_output=True, check=True)
    stats = r.stderr.decode().strip().splitlines()[-1]
    secs = float(stats.split(" in ")[1].split(" s")[0])
    ids = [[int(x) for x in line.split()] for line in r.stdout.decode().split("\n")[:-1]]
    return secs, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("OOMB_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--mb", type=float, default=20.0, help="megabytes of text (default 20)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the best is reported")
    a = ap.parse_args()
    try:
        import tokenizers
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("bench: needs `pip install tokenizers`")
    fixtures = os.environ.get("OOMB_FIXTURES", os.path.join(ROOT, "..", "shared", "fixtures"))
    tok_json = os.path.join(fixtures, "qwen-tokenizer", "tokenizer.json")
    vocab = os.path.join(ROOT, "models", "qwen2.5-vocab.gguf")
    tool = os.path.join(a.bin, "oomb-tokenize")
    docs, nbytes = corpus(int(a.mb * 1e6))
    if nbytes < a.mb * 1e6:
        sys.exit(f"bench: only {nbytes / 1e6:.1f} MB of text found (install python3.11-doc)")
    print(f"text: {len(docs)} documents, {nbytes / 1e6:.2f} MB (python3.11-doc sources + stdlib .py)")
    print(f"cores: {os.cpu_count()}, tokenizers {tokenizers.__version__}")

    with tempfile.TemporaryDirectory(prefix="oomb-bench-tok-") as tmp:
        path = os.path.join(tmp, "docs.jsonl")
        with open(path, "w") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
        rows = []
        # Ours, 1 thread and N threads.
        ours_ids = None
        for th in sorted({1, a.threads}):
            best = min(run_ours(tool, vocab, path, th) for _ in range(a.repeat))
            secs, ids = best
            ours_ids = ids
            rows.append((f"ggml-oomb oomb-tokenize, {th} thread(s)", th, secs))
        # HF, single thread (TOKENIZERS_PARALLELISM=false set before import has no effect on
        # encode(), which is sequential) and encode_batch on all cores.
        hf = Tokenizer.from_file(tok_json)
        best = None
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            hf_ids = [hf.encode(d, add_special_tokens=False).ids for d in docs]
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        rows.append(("HF tokenizers encode(), 1 thread", 1, best))
        best = None
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            batch = hf.encode_batch(docs, add_special_tokens=False)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        rows.append((f"HF tokenizers encode_batch(), {os.cpu_count()} cores", os.cpu_count(), best))
        same = ours_ids == hf_ids and [e.ids for e in batch] == hf_ids
        ntok = sum(len(x) for x in hf_ids)
    print(f"tokens: {ntok} ({nbytes / ntok:.2f} bytes/token); identical ids ours vs HF: {same}")
    print(f"{'':46s} {'seconds':>8s} {'MB/s':>8s} {'MB/s/core':>10s}")
    for name, cores, secs in rows:
        print(f"{name:46s} {secs:8.3f} {nbytes / secs / 1e6:8.2f} {nbytes / secs / 1e6 / cores:10.2f}")
    ours1 = next(s for n, c, s in rows if n.startswith("ggml-oomb") and c == 1)
    hf1 = next(s for n, c, s in rows if n.startswith("HF") and c == 1)
    print(f"per-core speed ratio ours / HF (1 thread each): {hf1 / ours1:.1f}x")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
