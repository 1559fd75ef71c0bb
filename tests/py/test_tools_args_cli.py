#!/usr/bin/env python3
"""Arguments of the bench programs, the embedding example and the outputs of oomb-train / oomb-eval
(a tester's list; each checked to fail before its fix):

  - oomb-bench-train / oomb-bench-memory: --reps 0 or -1 (was a segfault: the median of no steps),
    --ctx 0 or 1, --page 0, --chunk 0 (were SIGABRT after a message) and --threads past the CPU
    backend's cap are errors naming the option, exit 1; an unknown option exits 1 as in every other
    tool (was CLI11's 109); --ctx 32 without --page runs with page 32 (the default 64 was refused);
  - oomb-embed-example: steps / threads that are not whole numbers ("1e3" was read as 1, "5abc" as
    5) or threads past the cap (99999 aborted) are errors, exit 1;
  - oomb-train --dump-grads / --dump-logits and oomb-eval --json naming an input (--tokens, -m,
    --data-bin; also through a symbolic link) are refused, and the input is left as it was (it was
    replaced by the output, exit 0);
  - a FIFO as oomb-gguf-dump's file, oomb-export's -m / --lora, oomb-gguf-init's --vocab, oomb-tokenize's -m, the bench
    programs' -m, oomb-eval's -m, oomb-train's --tokens, or as --out/train.jsonl (fresh and --resume): exit 1 naming
    the FIFO (the opens waited for a writer forever).

Environment (set by CTest): OOMB_BIN_DIR, OOMB_FIXTURES_DEFAULT. Exit 0 pass, 1 failure, 77 skipped.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, Checks, make_bin, need_fixture, need_tools, run_tool  # noqa: E402

BENCH_TRAIN, BENCH_MEM, EMBED, TRAIN, EVAL, CONVERT = (
    os.path.join(BIN, t) for t in ("oomb-bench-train", "oomb-bench-memory", "oomb-embed-example", "oomb-train", "oomb-eval",
                                   "oomb-convert-hf"))
need_tools(BENCH_TRAIN, BENCH_MEM, EMBED, TRAIN, EVAL, CONVERT,
           *(os.path.join(BIN, t) for t in ("oomb-gguf-dump", "oomb-export", "oomb-gguf-init", "oomb-tokenize")))
C = Checks()


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def bench_cases():
    small = ["--ctx", "64", "--chunk", "16", "--page", "8"]
    for tool, extra in ((BENCH_TRAIN, ["--reps", "1", "--warmup", "0"]), (BENCH_MEM, [])):
        name = os.path.basename(tool)
        rc, o, e = run_tool([tool] + small + extra + ["--threads", "2"], timeout=300)
        C.check(rc == 0 and o.strip().startswith("{"), f"{name} runs ({e.strip()[-200:]})")
        cases = [(["--ctx", "0"], "--ctx 0 is out of range"), (["--ctx", "1"], "--ctx 1 is out of range"),
                 (["--ctx", "64", "--page", "0"], "--page 0 is out of range"),
                 (["--ctx", "64", "--chunk", "0"], "--chunk 0 is out of range"),
                 (["--ctx", "64", "--threads", "5000"], "--threads 5000 is out of range")]
        if tool == BENCH_TRAIN:
            cases += [(["--ctx", "64", "--reps", "0"], "--reps 0 is out of range"),
                      (["--ctx", "64", "--reps", "-1"], "--reps -1 is out of range"),
                      (["--ctx", "64", "--warmup", "-1"], "--warmup -1 is out of range")]
        else:
            cases += [(["--ctx", "64", "--resident-pages", "-2"], "--resident-pages -2 is out of range"),
                      (["--ctx", "64", "--offload-block", "0"], "--offload-block 0 is out of range")]
        for args, msg in cases:
            rc, o, e = run_tool([tool] + args, timeout=300)
            C.check(rc == 1 and f"{name}: error: {msg}" in e, f"{name} {' '.join(args)}: exit 1 naming the option (rc {rc}: {e.strip()[-200:]})")
        # no --page with a --ctx under the default 64: the default is --ctx (was refused: --page 64 is out of range)
        rc, o, e = run_tool([tool, "--ctx", "32", "--chunk", "16", "--threads", "2"] + extra, timeout=300)
        C.check(rc == 0 and '"page": 32' in o.replace('"page":32', '"page": 32'),
                f"{name} --ctx 32 without --page runs with page 32 (rc {rc}: {o.strip()[-200:]} {e.strip()[-200:]})")
        rc, o, e = run_tool([tool, "--bogus"])
        C.check(rc == 1 and "--bogus" in e, f"{name} --bogus: exit 1 as the other tools (rc {rc})")


def embed_cases():
    rc, o, e = run_tool([EMBED, "5", "2"])
    C.check(rc == 0 and "5 steps" in o, f"oomb-embed-example 5 2 runs (rc {rc})")
    for args in (["1e3"], ["5abc"], ["0"], ["-3"], ["5", "99999"], ["5", "2x"], ["5", "0"]):
        rc, o, e = run_tool([EMBED] + args)
        C.check(rc == 1 and "oomb-embed-example: error:" in e and f"'{args[-1]}'" in e,
                f"oomb-embed-example {' '.join(args)}: exit 1 naming the argument (rc {rc}: {e.strip()[-200:]})")


def output_is_input_cases(tmp):
    micro = need_fixture("qwen2-micro")
    model = os.path.join(tmp, "micro.gguf")
    rc, o, e = run_tool([CONVERT, micro, "-o", model])
    if rc != 0:
        C.check(False, f"oomb-convert-hf qwen2-micro: {e.strip()[-200:]}")
        return
    tokens = os.path.join(tmp, "tokens.safetensors")
    shutil.copyfile(os.path.join(micro, "reference-short.safetensors"), tokens)
    link = os.path.join(tmp, "tokens-link.safetensors")
    os.symlink(tokens, link)
    before, model_before = sha(tokens), sha(model)
    verify = [TRAIN, "-m", model, "--tokens", tokens, "--chunk", "16", "--page", "8", "--threads", "2"]
    for opt, out in (("--dump-grads", tokens), ("--dump-grads", link), ("--dump-logits", tokens), ("--dump-grads", model)):
        rc, o, e = run_tool(verify + [opt, out])
        C.check(rc == 1 and f"{opt} {out} is the input" in e,
                f"oomb-train {opt} {os.path.basename(out)} (an input) refused: rc {rc} {e.strip()[-200:]}")
    C.check(sha(tokens) == before and sha(model) == model_before, "oomb-train: the inputs are unchanged")
    rc, o, e = run_tool(verify + ["--dump-grads", os.path.join(tmp, "grads.safetensors")])
    C.check(rc == 0, f"oomb-train --dump-grads to another file runs ({e.strip()[-200:]})")

    ids = os.path.join(tmp, "ids.bin")
    make_bin(ids, 300, 4096)
    ids_before = sha(ids)
    ev = [EVAL, "-m", model, "--data-bin", ids, "--ctx", "64", "--chunk", "32", "--page", "16", "--threads", "2"]
    for out in (ids, model):
        rc, o, e = run_tool(ev + ["--json", out])
        C.check(rc == 1 and f"--json {out} is the input" in e, f"oomb-eval --json {os.path.basename(out)} (an input) refused: rc {rc} {e.strip()[-200:]}")
    C.check(sha(ids) == ids_before and sha(model) == model_before, "oomb-eval: the inputs are unchanged")
    rc, o, e = run_tool(ev + ["--json", os.path.join(tmp, "eval.json")])
    C.check(rc == 0 and os.path.exists(os.path.join(tmp, "eval.json")), f"oomb-eval --json to another file runs ({e.strip()[-200:]})")


def fifo_cases(tmp):
    """A FIFO given as a model, vocabulary, adapter, token or log file: an error naming it (exit 1), not an open that
    waits for a writer forever (the format readers opened without O_NONBLOCK)."""
    model = os.path.join(tmp, "micro.gguf")
    if not os.path.exists(model):
        return
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    tok = os.path.join(tmp, "t.txt")
    with open(tok, "w") as f:
        f.write("hello world\n")
    init = [os.path.join(BIN, "oomb-gguf-init"), "--vocab-size", "256", "--hidden", "64", "--ffn", "96", "--layers", "1", "--heads", "2",
            "-o", os.path.join(tmp, "i.gguf")]
    cases = [
        ([os.path.join(BIN, "oomb-gguf-dump"), fifo], "a FIFO"),
        ([os.path.join(BIN, "oomb-export"), "-m", fifo, "--out-type", "f32", "-o", os.path.join(tmp, "e.gguf")], "a FIFO"),
        ([os.path.join(BIN, "oomb-export"), "-m", model, "--lora", fifo, "--out-type", "f32", "-o", os.path.join(tmp, "e.gguf")], "a FIFO"),
        (init + ["--vocab", fifo], "a FIFO"),
        ([os.path.join(BIN, "oomb-tokenize"), "-m", fifo, "-f", tok], "a FIFO"),
        ([BENCH_TRAIN, "-m", fifo, "--ctx", "32"], "a FIFO"),
        ([BENCH_MEM, "-m", fifo, "--ctx", "32"], "a FIFO"),
        ([EVAL, "-m", fifo, "--data", tok], "FIFO"),
        ([TRAIN, "-m", model, "--tokens", fifo, "--dump-grads", os.path.join(tmp, "g.safetensors")], "a FIFO"),
    ]
    for args, want in cases:
        name = " ".join(os.path.basename(a) if a.startswith(tmp) or a.startswith(BIN) else a for a in args)
        try:
            rc, o, e = run_tool(args, timeout=60)
        except subprocess.TimeoutExpired:
            C.check(False, f"{name}: blocked on the FIFO (killed after 60 s)")
            continue
        C.check(rc == 1 and want in e, f"{name}: exit 1 naming the FIFO (rc {rc}: {e.strip()[-200:]})")
    # the run's log train.jsonl as a FIFO in --out: an error, before the run (fresh and --resume)
    out = os.path.join(tmp, "fifo-out")
    ids = os.path.join(tmp, "ids.bin")
    run = [TRAIN, "-m", model, "--data-bin", ids, "--ctx", "32", "--chunk", "16", "--page", "8", "--steps", "2", "--threads", "2",
           "--eval-every", "0", "--out", out]
    rc, o, e = run_tool(run + ["--stop-after", "1"])  # a checkpoint at step 1 to resume
    C.check(rc == 0, f"oomb-train: a checkpoint at step 1 (rc {rc}: {e.strip()[-200:]})")
    os.unlink(os.path.join(out, "train.jsonl"))
    os.mkfifo(os.path.join(out, "train.jsonl"))
    for extra in ([], ["--resume"]):
        try:
            rc, o, e = run_tool(run + extra, timeout=60)
        except subprocess.TimeoutExpired:
            C.check(False, f"oomb-train {' '.join(extra)} with --out/train.jsonl a FIFO: blocked (killed after 60 s)")
            continue
        C.check(rc == 1 and "a FIFO" in e, f"oomb-train {' '.join(extra)} with --out/train.jsonl a FIFO: exit 1 naming it (rc {rc}: {e.strip()[-200:]})")
    # model.gguf as a FIFO on --resume: named as such (was "not found")
    os.unlink(os.path.join(out, "train.jsonl"))
    os.unlink(os.path.join(out, "model.gguf"))
    os.mkfifo(os.path.join(out, "model.gguf"))
    rc, o, e = run_tool(run + ["--resume"], timeout=60)
    C.check(rc == 1 and "model.gguf' is not a regular file (a FIFO)" in e, f"oomb-train --resume with model.gguf a FIFO: named (rc {rc}: {e.strip()[-200:]})")


def main():
    bench_cases()
    embed_cases()
    with tempfile.TemporaryDirectory(prefix="oomb-py-tools-args-") as tmp:
        output_is_input_cases(tmp)
        fifo_cases(tmp)
    C.finish()


if __name__ == "__main__":
    main()
