#!/usr/bin/env python3
"""Host offload through the command line (issue 12's verification contract), on the CPU backend:

  - `oomb-train -m M.gguf --tokens IDS --chunk C --page P --device cpu --offload on
    --gpu-kv-budget 0.00035 --dump-grads OUT` (part of the pages resident: 0.001 GiB would hold the whole
    cache, which then stays resident) gives the same gradients as without offload (every
    tensor to 1e-5 of its largest element: only the blocks' summation order differs), for chunk and
    page sizes that do not divide the sequence (qwen2-mini, 64 tokens: chunk 13 / page 5, chunk 24 /
    page 7), and the memory plan says what streams;
  - a training run with offload prints the plan and the progress line's host-KV and copy figures,
    and logs them in train.jsonl;
  - a copy that fails mid-run (OOMB_DEBUG_OFFLOAD_FAIL_COPY, the test hook) stops the run with a
    message naming it and a non-zero exit, and the last checkpoint stays loadable: --resume from it
    finishes the run;
  - bad settings: --offload maybe, --gpu-kv-budget -1 / 1e308 / inf / 0x10, --gpu-kv-budget with --offload off,
    --offload-block -2: clear messages, exit 1;
  - oomb-eval --offload on gives the resident perplexity.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR, OOMB_FIXTURES_DEFAULT (OOMB_FIXTURES
overrides it). Exit 0: all passed; 1: a failure; 77 (skip, with a SKIPPED line): a tool, fixture or
Python package missing.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
FIX = os.environ.get("OOMB_FIXTURES") or os.environ.get("OOMB_FIXTURES_DEFAULT") or os.path.join(SRC, "..", "shared", "fixtures")
TRAIN, EVAL, CONVERT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-eval", "oomb-convert-hf"))
sys.path.insert(0, HERE)
from train_data import Checks, need_tools, skip  # noqa: E402

try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    skip(f"{e} (needs numpy and safetensors)")
need_tools(TRAIN, EVAL, CONVERT)
if not os.path.isdir(os.path.join(FIX, "qwen2-mini")):
    skip(f"fixture qwen2-mini not in {FIX}")

checks = Checks()
check = checks.check


def run(args, env=None, timeout=600):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=e)


def worst_rel(a, b):
    w = 0.0
    for k in b:
        if not k.startswith("grad."):
            continue
        x, y = a[k].astype(np.float64), b[k].astype(np.float64)
        w = max(w, float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)))
    return w


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-offload-") as tmp:
        gguf = os.path.join(tmp, "mini.gguf")
        r = run([CONVERT, os.path.join(FIX, "qwen2-mini"), "--outtype", "f32", "-o", gguf])
        if r.returncode != 0:
            sys.exit(f"FAIL: oomb-convert-hf: {r.stdout}{r.stderr}")
        ref = load_file(os.path.join(FIX, "qwen2-mini", "reference-short.safetensors"))
        ids = os.path.join(tmp, "ids.safetensors")
        save_file({"input_ids": ref["input_ids"].astype(np.int32)}, ids)

        # 1. the verification contract: offloaded gradients == resident ones
        for chunk, page in ((13, 5), (24, 7)):
            out = {}
            for name, extra in (("resident", []), ("offload", ["--offload", "on", "--gpu-kv-budget", "0.00035"]),
                                ("offload-all", ["--offload", "on", "--gpu-kv-budget", "0.0001"]),
                                ("offload-late", ["--offload", "on", "--gpu-kv-budget", "0.0001"])):
                path = os.path.join(tmp, f"g-{name}-{chunk}.safetensors")
                # offload-late: a node's first copies after the part before it (as before the switch)
                r = run([TRAIN, "-m", gguf, "--tokens", ids, "--chunk", str(chunk), "--page", str(page), "--device", "cpu",
                         "--dump-grads", path] + extra, env={"OOMB_OFFLOAD_EARLY_COPIES": "0" if name == "offload-late" else "1"})
                if r.returncode != 0:
                    check(False, f"--dump-grads {name} chunk {chunk}: exit {r.returncode}: {r.stderr[-400:]}")
                    break
                out[name] = load_file(path)
                if name != "resident":
                    check("streamed from plain host memory" in r.stdout, f"chunk {chunk} page {page} {name}: the plan says the KV pages stream")
                if name in ("offload-all", "offload-late"):
                    check("0 resident" in r.stdout, f"chunk {chunk} page {page}: a budget of 3 pages keeps none resident")
            if "offload-all" in out and "offload-late" in out:
                same = all(np.array_equal(out["offload-all"][k], out["offload-late"][k]) for k in out["offload-all"])
                check(same and out["offload-all"].keys() == out["offload-late"].keys(),
                      f"chunk {chunk} page {page}: OOMB_OFFLOAD_EARLY_COPIES=0 and =1 give bit-identical gradients")
            for name in ("offload", "offload-all"):
                if name not in out or "resident" not in out:
                    continue
                w = worst_rel(out[name], out["resident"])
                check(w < 1e-5, f"chunk {chunk} page {page} {name}: offloaded gradients equal resident ones (worst {w:.2e}, tol 1e-5)")
                l0, l1 = float(out["resident"]["loss"][0]), float(out[name]["loss"][0])
                check(abs(l1 - l0) <= 1e-6 * abs(l0), f"chunk {chunk} page {page} {name}: same loss ({l1:.8f} vs {l0:.8f})")

        # 2. a training run with offload: plan, progress line, JSONL
        data = os.path.join(tmp, "rand.bin")
        np.random.default_rng(0).integers(0, 2048, size=20000, dtype=np.uint32).tofile(data)
        base = [TRAIN, "-m", gguf, "--data-bin", data, "--ctx", "200", "--chunk", "64", "--page", "16", "--eval-every", "0",
                "--offload", "on", "--gpu-kv-budget", "0.001", "--threads", "2"]
        o1 = os.path.join(tmp, "run1")
        r = run(base + ["--steps", "2", "--save-every", "-1", "-o", o1])
        check(r.returncode == 0, f"training with --offload on: exit {r.returncode} {r.stderr[-300:]}")
        check("memory plan" in r.stdout and "streamed from plain host memory" in r.stdout, "training prints the memory plan")
        check("host KV" in r.stdout and "% hidden" in r.stdout, "the progress line shows the host KV and the copy time")
        rows = [json.loads(x) for x in open(os.path.join(o1, "train.jsonl"))] if r.returncode == 0 else []
        check(bool(rows) and rows[-1].get("offload_bytes_in", 0) > 0 and rows[-1].get("offload_copies", 0) > 0,
              "train.jsonl logs the offload bytes and copies")
        per_step = rows[-1]["offload_copies"] if rows else 0

        # 3. a copy failing in step 3 of 4: message, exit code, the step-2 checkpoint kept and resumable
        if per_step:
            o2 = os.path.join(tmp, "run2")
            r = run(base + ["--steps", "4", "--save-every", "1", "-o", o2], env={"OOMB_DEBUG_OFFLOAD_FAIL_COPY": str(2 * per_step + 3)})
            check(r.returncode != 0 and "injected by OOMB_DEBUG_OFFLOAD_FAIL_COPY" in r.stderr,
                  f"a failed copy stops the run with a message (exit {r.returncode}: {r.stderr.strip()[-200:]})")
            check("checkpoint: step 2" in r.stdout and "checkpoint: step 3" not in r.stdout, "the run saved steps 1 and 2, not 3")
            r = run(base + ["--steps", "4", "--save-every", "1", "-o", o2, "--resume"])
            check(r.returncode == 0 and "step 4/4" in r.stdout, f"--resume after the fault finishes the run (exit {r.returncode} {r.stderr[-200:]})")

        # auto: the most pages that fit stay resident (a budget of 18 of 19 pages), and a budget above
        # the cache keeps all of it on the device (fresh review: auto streamed every page here)
        r = run(base[:-6] + ["--ctx", "300", "--chunk", "70", "--offload", "auto", "--gpu-kv-budget", "0.0017", "--steps", "1",
                             "--save-every", "-1", "-o", os.path.join(tmp, "run-auto")])
        check(r.returncode == 0 and "10 resident + 8 slots" in r.stdout, f"auto keeps 10 of 19 pages resident: {r.stdout[-600:]}")
        r = run(base[:-6] + ["--ctx", "300", "--chunk", "70", "--offload", "auto", "--gpu-kv-budget", "1", "--steps", "1",
                             "--save-every", "-1", "-o", os.path.join(tmp, "run-auto2")])
        check(r.returncode == 0 and "all on the device" in r.stdout, "auto with a budget above the cache: all on the device")

        # (s6 review) --offload on with a budget above the whole cache keeps every page resident as
        # auto does (it streamed one page through 2 + 1 slots); the counters say nothing streamed
        def jsonl(o):
            p = os.path.join(o, "train.jsonl")
            return [json.loads(x) for x in open(p)] if os.path.exists(p) else [{}]
        o_on = os.path.join(tmp, "run-on-big")
        r = run(base[:-6] + ["--ctx", "300", "--chunk", "70", "--offload", "on", "--gpu-kv-budget", "1", "--steps", "1",
                             "--save-every", "-1", "-o", o_on])
        check(r.returncode == 0 and "all on the device" in r.stdout and "nothing streams" in r.stdout and "host KV" not in r.stdout
              and jsonl(o_on)[-1].get("offload_bytes_in", 0) == 0,
              f"--offload on with a budget above the cache: all resident, nothing copied ({r.stdout[-500:]})")
        # a huge --offload-block is capped at the cache's pages (19; none resident without a budget):
        # the same plan (6 chunk slots + 2 x 19) and the same copies as --offload-block 19. (The
        # driver already capped the slots it allocates, chunk_kv_tier; the C API did not, test-offload)
        plans, copies = {}, {}
        for blk in ("100000", "19"):
            ob = os.path.join(tmp, "run-block-" + blk)
            r = run(base[:-6] + ["--ctx", "300", "--chunk", "70", "--offload", "on", "--offload-block", blk,
                                 "--steps", "1", "--save-every", "-1", "-o", ob])
            plans[blk] = [x for x in r.stdout.splitlines() if "resident +" in x]
            copies[blk] = (jsonl(ob)[-1].get("offload_bytes_in"), jsonl(ob)[-1].get("offload_copies"))
            check(r.returncode == 0 and len(plans[blk]) == 1 and "0 resident + 44 slots" in plans[blk][0] and "blocks of 19 pages" in plans[blk][0],
                  f"--offload-block {blk}: blocks of the 19 streamed pages ({r.stdout[-600:]})")
            if blk == "100000":
                check("--offload-block 100000 is more than the KV cache's 19 pages" in r.stdout, "a huge --offload-block: a note")
        check(plans["100000"] == plans["19"] and copies["100000"] == copies["19"] and copies["19"][0],
              f"a huge --offload-block streams as the capped one ({plans}, {copies})")

        # (fresh review, issue 12) a budget below the streams' minimum: a warning that names the device
        # bytes it holds instead; a sequence of one chunk: nothing to stream, the cache stays resident
        r = run(base[:-6] + ["--ctx", "300", "--chunk", "70", "--offload", "on", "--gpu-kv-budget", "0", "--steps", "1",
                             "--save-every", "-1", "-o", os.path.join(tmp, "run-budget0")])
        check(r.returncode == 0 and "warning: the KV budget (0 B, 0 pages) is below what streaming needs on the device" in r.stdout
              and "0 resident +" in r.stdout, f"--gpu-kv-budget 0: a warning, then every page streams ({r.stdout[-600:]})")
        r = run(base[:-6] + ["--ctx", "300", "--chunk", "300", "--offload", "on", "--gpu-kv-budget", "0.0001", "--steps", "1",
                             "--save-every", "-1", "-o", os.path.join(tmp, "run-one-chunk")])
        check(r.returncode == 0 and "is a single chunk" in r.stdout and "all on the device" in r.stdout and "host KV" not in r.stdout,
              f"one chunk per sequence: no history, the cache stays resident ({r.stdout[-600:]})")

        # 4. bad settings
        for bad, msg in ((["--offload", "maybe"], "--offload must be auto, on or off"),
                         (["--offload", "on", "--gpu-kv-budget", "-1"], "--gpu-kv-budget must be a number of GiB from 0 to 1e6"),
                         (["--offload", "on", "--gpu-kv-budget", "1e308"], "from 0 to 1e6, got 1e+308"),
                         (["--offload", "on", "--gpu-kv-budget", "inf"], "must be a decimal number of GiB"),
                         (["--offload", "on", "--gpu-kv-budget", "0x10"], "must be a decimal number of GiB"),
                         (["--offload", "off", "--gpu-kv-budget", "1"], "needs --offload auto or on"),
                         (["--offload-block", "-2"], "--offload-block must be >= 0"),
                         (["--offload", "off", "--offload-block", "3"], "--offload-block sets the streamed blocks")):
            r = run([TRAIN, "-m", gguf, "--tokens", ids, "--dump-grads", os.path.join(tmp, "x.safetensors")] + bad)
            check(r.returncode == 1 and msg in r.stderr, f"{' '.join(bad)}: exit 1 with '{msg}' (got {r.returncode}: {r.stderr.strip()[-200:]})")

        # 5. oomb-eval with offload: the same perplexity
        res = {}
        for name, extra in (("resident", []), ("offload", ["--offload", "on", "--gpu-kv-budget", "0.0005"])):
            js = os.path.join(tmp, f"eval-{name}.json")
            r = run([EVAL, "-m", gguf, "--data-bin", data, "--ctx", "300", "--chunk", "70", "--page", "16", "--max-tokens", "900",
                     "--json", js] + extra)
            check(r.returncode == 0, f"oomb-eval {name}: exit {r.returncode} {r.stderr[-300:]}")
            if r.returncode == 0:
                res[name] = json.load(open(js))
        if len(res) == 2:
            a, b = res["resident"]["mean_nll"], res["offload"]["mean_nll"]
            check(abs(a - b) <= 1e-6 * abs(a), f"oomb-eval: offloaded mean NLL {b:.8f} equals resident {a:.8f}")

    checks.finish()


if __name__ == "__main__":
    main()
