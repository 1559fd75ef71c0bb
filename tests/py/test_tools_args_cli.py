#!/usr/bin/env python3
"""Arguments of the bench programs and the embedding example (a tester's list; each checked to fail
before its fix):

  - oomb-bench-train / oomb-bench-memory: --reps 0 or -1 (was a segfault: the median of no steps),
    --ctx 0 or 1, --page 0, --chunk 0 (were SIGABRT after a message) and --threads past the CPU
    backend's cap are errors naming the option, exit 1; an unknown option exits 1 as in every other
    tool (was CLI11's 109);
  - oomb-embed-example: steps / threads that are not whole numbers ("1e3" was read as 1, "5abc" as
    5) or threads past the cap (99999 aborted) are errors, exit 1.

Environment (set by CTest): OOMB_BIN_DIR. Exit 0 pass, 1 failure, 77 skipped.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, Checks, need_tools, run_tool  # noqa: E402

BENCH_TRAIN, BENCH_MEM, EMBED = (os.path.join(BIN, t) for t in ("oomb-bench-train", "oomb-bench-memory", "oomb-embed-example"))
need_tools(BENCH_TRAIN, BENCH_MEM, EMBED)
C = Checks()


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
        for args, msg in cases:
            rc, o, e = run_tool([tool] + args, timeout=300)
            C.check(rc == 1 and f"{name}: error: {msg}" in e, f"{name} {' '.join(args)}: exit 1 naming the option (rc {rc}: {e.strip()[-200:]})")
        rc, o, e = run_tool([tool, "--bogus"])
        C.check(rc == 1 and "--bogus" in e, f"{name} --bogus: exit 1 as the other tools (rc {rc})")


def embed_cases():
    rc, o, e = run_tool([EMBED, "5", "2"])
    C.check(rc == 0 and "5 steps" in o, f"oomb-embed-example 5 2 runs (rc {rc})")
    for args in (["1e3"], ["5abc"], ["0"], ["-3"], ["5", "99999"], ["5", "2x"], ["5", "0"]):
        rc, o, e = run_tool([EMBED] + args)
        C.check(rc == 1 and "oomb-embed-example: error:" in e and f"'{args[-1]}'" in e,
                f"oomb-embed-example {' '.join(args)}: exit 1 naming the argument (rc {rc}: {e.strip()[-200:]})")


def main():
    bench_cases()
    embed_cases()
    C.finish()


if __name__ == "__main__":
    main()
