#!/usr/bin/env python3
"""--progress-every: the in-step progress lines of oomb-train (both stages of the chunk driver) and
oomb-eval (windows), on the CPU with a small random Llama GGUF and many chunks (ctx 1024, chunk 16:
64 chunks a stage):

  - `--progress-every 0.01` prints lines "  step 1/1 | stage S chunk C/64 | N tok/s | step ETA D |
    RSS X" for stage 1 then stage 2, each stage's chunk numbers increasing, the ETA parseable
    (fmt_duration: 12s, 3m05s, 1h02m);
  - `--progress-every 0` and the default (30 s, longer than these steps) print none, and the rest of
    stdout has the same lines as a run without the option;
  - bad values (-1, abc, nan) stop with exit 1 and a message naming --progress-every;
  - oomb-eval: "  windows K/N done | chunk C/n | N tok/s | ETA D | RSS X" lines in order, none with 0.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0: all passed; 1: a failure; 77
(skip, with a SKIPPED line): a tool or Python package missing.
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, Checks, make_bin, make_llama, need_tools, run_tool, skip  # noqa: E402

try:
    import numpy  # noqa: F401
    import gguf  # noqa: F401
except ImportError as e:
    skip(f"{e} (needs numpy and gguf-py)")
TRAIN, EVAL = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-eval"))
need_tools(TRAIN, EVAL)

checks = Checks()
check = checks.check
ETA = r"(?:\d+h\d\dm|\d+m\d\ds|\d+s)"
STEP_LINE = re.compile(r"^  step 1/1 \| stage ([12]) chunk (\d+)/(\d+) \| (\d+) tok/s \| step ETA (" + ETA + r") \|.* ?RSS \d+(\.\d+)? [KMGT]?i?B$")
EVAL_LINE = re.compile(r"^  windows (\d+)/(\d+) done \| chunk (\d+)/(\d+) \| (\d+) tok/s \| ETA (" + ETA + r") \|.* ?RSS \d+(\.\d+)? [KMGT]?i?B$")


def strictly_increasing(xs):
    return all(a < b for a, b in zip(xs, xs[1:]))


def stable(out):
    """stdout without the lines whose numbers vary from run to run (the step line and the summary: timings;
    the memory plan: measured host bytes)."""
    return [l for l in out.splitlines() if not l.startswith(("step ", "done:", "memory plan"))]


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-progress-") as tmp:
        model = os.path.join(tmp, "llama.gguf")
        make_llama(model)
        data = os.path.join(tmp, "ids.bin")
        make_bin(data, 2 * 1024 + 1, 512)
        base = [TRAIN, "-m", model, "--data-bin", data, "--ctx", "1024", "--chunk", "16", "--page", "16", "--steps", "1",
                "--threads", "2", "--save-every", "-1", "--eval-split", "0"]

        rc, out, err = run_tool(base + ["--out", os.path.join(tmp, "p"), "--progress-every", "0.01"])
        check(rc == 0, f"--progress-every 0.01 trains: exit {rc} {err.strip()[-300:]}")
        lines = [l for l in out.splitlines() if l.startswith("  step ")]
        parsed = [STEP_LINE.match(l) for l in lines]
        check(lines and all(parsed), f"every progress line parses ({[l for l, m in zip(lines, parsed) if not m][:3]})")
        parsed = [m for m in parsed if m]
        stages = [int(m.group(1)) for m in parsed]
        s1 = [int(m.group(2)) for m in parsed if m.group(1) == "1"]
        s2 = [int(m.group(2)) for m in parsed if m.group(1) == "2"]
        check(len(s1) >= 2 and len(s2) >= 2, f"at least two lines in each stage (stage 1: {s1}, stage 2: {s2})")
        check(stages == sorted(stages), f"stage 1's lines come before stage 2's ({stages})")
        check(strictly_increasing(s1) and strictly_increasing(s2), f"chunk numbers increase within each stage ({s1}, {s2})")
        check(all(m.group(3) == "64" for m in parsed), "64 chunks a stage")
        check(all(int(m.group(4)) > 0 for m in parsed), "tok/s positive")
        check(all(0 < n <= 64 for n in s1 + s2), f"chunk numbers within 1..64 ({s1 + s2})")
        with_lines = out

        runs = {}
        for name, extra in (("0", ["--progress-every", "0"]), ("default", [])):
            rc, out, err = run_tool(base + ["--out", os.path.join(tmp, "o" + name)] + extra)
            check(rc == 0, f"--progress-every {name}: exit {rc} {err.strip()[-300:]}")
            check(not any(l.startswith("  step ") for l in out.splitlines()), f"--progress-every {name}: no progress line")
            runs[name] = out
        strip_out = lambda o, d: [l.replace(os.path.join(tmp, d), "OUT") for l in stable(o)]
        check(strip_out(runs["0"], "o0") == strip_out(runs["default"], "odefault"),
              "the run's other lines are the same with --progress-every 0 and the default")
        check([l for l in strip_out(with_lines, "p") if not l.startswith("  step ")] == strip_out(runs["0"], "o0"),
              "--progress-every 0.01 only adds the progress lines")

        for bad in ("-1", "abc", "nan"):
            rc, out, err = run_tool(base + ["--out", os.path.join(tmp, "bad"), "--progress-every", bad])
            check(rc == 1 and "--progress-every" in err, f"--progress-every {bad}: exit 1 naming the option (exit {rc}, {err.strip()[-200:]})")

        ev = [EVAL, "-m", model, "--data-bin", data, "--ctx", "512", "--chunk", "8", "--page", "8", "--threads", "2", "--max-tokens", "2048"]
        rc, out, err = run_tool(ev + ["--progress-every", "0.01"])
        check(rc == 0, f"oomb-eval --progress-every 0.01: exit {rc} {err.strip()[-300:]}")
        lines = [l for l in out.splitlines() if l.startswith("  windows ")]
        parsed = [EVAL_LINE.match(l) for l in lines]
        check(len(lines) >= 2 and all(parsed), f"oomb-eval: progress lines that parse ({lines[:3]})")
        order = [(int(m.group(1)), int(m.group(3))) for m in parsed if m]
        check(strictly_increasing(order), f"oomb-eval: windows / chunks increase ({order})")
        check(all(m.group(2) == "4" and m.group(4) == "64" and int(m.group(1)) < 4 for m in parsed if m),
              "oomb-eval: 4 windows of 64 chunks")
        rc0, out0, err0 = run_tool(ev + ["--progress-every", "0"])
        check(rc0 == 0 and not any(l.startswith("  windows ") for l in out0.splitlines()), "oomb-eval --progress-every 0: no line")
        rc, out, err = run_tool(ev + ["--progress-every", "-1"])
        check(rc == 1 and "--progress-every" in err, f"oomb-eval --progress-every -1: exit 1 naming the option ({err.strip()[-200:]})")
    checks.finish()


if __name__ == "__main__":
    main()
