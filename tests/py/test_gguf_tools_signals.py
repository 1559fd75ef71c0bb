#!/usr/bin/env python3
"""Ctrl-C / SIGTERM during a long GGUF write by a gguf-tool (oomb-gguf-init, run as a subprocess).

The tool streams a real-size model (--preset qwen2.5-0.5b, about 1 GB) into OUT.tmp.<pid>; once
that file has grown past a few MB the test sends SIGINT (as Ctrl-C does) or SIGTERM. Expected:
the tool dies of that signal, no OUT.tmp.* is left in the folder, and the OUT written before is
untouched (byte for byte).

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 77 = skipped.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
INIT = os.path.join(BIN, "oomb-gguf-init")
VOCAB = os.path.join(SRC, "models", "qwen2.5-vocab.gguf")

failures = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    print(f"  {'ok  ' if cond else 'FAIL'} {what}")
    if not cond:
        failures.append(what)


def interrupt_write(tmp, sig, with_vocab):
    out = os.path.join(tmp, "prev.gguf")
    previous = b"previous model file\n" * 1000
    with open(out, "wb") as f:
        f.write(previous)
    args = [INIT, "--preset", "qwen2.5-0.5b", "-o", out, "-t", "1", "--seed", "3"]
    if with_vocab:
        args += ["--vocab", VOCAB]
    # Default dispositions in the child: a signal ignored here (SIGINT in a background job of a
    # script) would stay ignored, as the tool rightly leaves ignored signals alone.
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)])
    part = f"{out}.tmp.{p.pid}"
    grown = False
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        try:
            if os.path.getsize(part) > (8 << 20):
                grown = True
                break
        except OSError:
            pass
        time.sleep(0.01)
    check(grown, f"{signal.Signals(sig).name}: the write is under way ({part} past 8 MB)")
    if p.poll() is None:
        p.send_signal(sig)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    err = p.stderr.read().decode(errors="replace")
    check(p.returncode == -sig, f"{signal.Signals(sig).name}: the tool dies of the signal (status {p.returncode}) {err.strip()[-200:]}")
    left = [n for n in os.listdir(tmp) if ".tmp." in n]
    check(not left, f"{signal.Signals(sig).name}: no temporary file left ({left})")
    with open(out, "rb") as f:
        check(f.read() == previous, f"{signal.Signals(sig).name}: the previous {os.path.basename(out)} is intact")


def main():
    if not os.path.exists(INIT):
        print(f"skip: {INIT} not built")
        return 77
    tmp = tempfile.mkdtemp(prefix="oomb-signal-test-")
    t0 = time.time()
    try:
        # the vocabulary is tracked in git: without it the tokenizer-keys variant would not run
        check(os.path.exists(VOCAB), f"{VOCAB} exists")
        interrupt_write(tmp, signal.SIGINT, os.path.exists(VOCAB))
        interrupt_write(tmp, signal.SIGTERM, False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{checks - len(failures)}/{checks} checks passed in {time.time() - t0:.1f} s")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
