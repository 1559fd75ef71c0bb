#!/usr/bin/env python3
"""Checkpoint edge cases and LoRA's PEFT files through the command line (oomb-train), CPU backend:

  - --lora-alpha 0 trains with scale 1 (llama.cpp's rule for alpha 0, kept in adapter.gguf as 0);
    adapter_config.json then says lora_alpha = r, the alpha that gives PEFT (scale lora_alpha / r
    always) the same scale 1, not 0; a non-zero alpha is written as given;
  - --resume of a LoRA run on another base is refused, naming both: another quantization of the
    same model (oomb-export --out-type q8_0 of the f32 base) and another random --preset base
    (--base-type q4_k vs q8_0); the same base under another path (a copy) and another --base-type
    of the same -m file (keep vs f32: the same file, converted on load) still resume;
  - a save that fails (here: OUT/state.safetensors.saving is a folder, so the state's rename fails)
    exits 1 with the reason and leaves none of the complete "*.saving" files it wrote
    (adapter.gguf.saving, adapter_model.safetensors.saving, adapter_config.json.saving;
    model.gguf.saving for a full-model run) nor a temporary file; the previous checkpoint stays;
  - a complete model.gguf.saving that a killed save left is removed before the next save writes
    its own, so that it does not need the space twice (checked on a small tmpfs, as root; else
    that part prints SKIPPED);
  - a folder given to -m, --lora or --data-bin is named as a folder, not as a missing file;
  - a run whose last steps are non-finite (--lr 1e30 --grad-clip 0: step 1 finite, then NaN, fewer
    than --max-bad-steps) exits 2 naming the last good checkpoint (step 1), not 0 with "done" and
    no final checkpoint; without any saved step it says that no checkpoint was written.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0 pass, 1 failure, 77 skipped.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, Checks, make_bin, make_llama, need_tools, run_tool, skip  # noqa: E402

TRAIN, EXPORT, EVAL = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-export", "oomb-eval"))
need_tools(TRAIN, EXPORT, EVAL)
try:
    import gguf  # the adapter's keys; make_llama writes the base with it (and numpy)
except ImportError as e:
    skip(f"{e} (needs gguf and numpy)")
C = Checks()


def leftovers(out):
    return sorted(n for n in os.listdir(out) if ".saving" in n or ".tmp." in n)


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-lora-ckpt-") as tmp:
        base = os.path.join(tmp, "base.gguf")
        make_llama(base)
        data = os.path.join(tmp, "ids.bin")
        make_bin(data, 6000, 512)
        common = ["--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--lr", "1e-2", "--eval-every", "0",
                  "--eval-seqs", "1", "--threads", "2", "--steps", "4", "--save-every", "1"]
        lora = common + ["--trainable", "lora", "--lora-rank", "4"]

        # --lora-alpha 0: scale 1 here and in llama.cpp; PEFT needs lora_alpha = r for that scale
        for alpha, want in (("0", 4.0), ("8", 8.0)):
            out = os.path.join(tmp, "alpha" + alpha)
            rc, _, e = run_tool([TRAIN, "-m", base] + lora + ["--lora-alpha", alpha, "--out", out])
            C.check(rc == 0, f"--lora-alpha {alpha}: trains (rc {rc}) {e.strip()[-200:]}")
            if rc:
                continue
            cfg = json.load(open(os.path.join(out, "adapter_config.json")))
            C.check(cfg["r"] == 4 and cfg["lora_alpha"] == want,
                    f"--lora-alpha {alpha}: adapter_config.json r 4, lora_alpha {want} (PEFT scale {want / 4}), got {cfg['lora_alpha']}")
            r = gguf.GGUFReader(os.path.join(out, "adapter.gguf"))
            f = r.fields["adapter.lora.alpha"]
            C.check(float(f.parts[-1][0]) == float(alpha), f"--lora-alpha {alpha}: adapter.gguf keeps adapter.lora.alpha {alpha}")

        # --resume on another base
        q8 = os.path.join(tmp, "base-q8_0.gguf")
        rc, _, e = run_tool([EXPORT, "-m", base, "--out-type", "q8_0", "-o", q8])
        C.check(rc == 0, f"oomb-export --out-type q8_0 re-types the base {e.strip()[-200:]}")
        out = os.path.join(tmp, "resume")
        rc, _, e = run_tool([TRAIN, "-m", base] + lora + ["--stop-after", "2", "--out", out])
        C.check(rc == 0, f"LoRA run stopped after step 2 (rc {rc}) {e.strip()[-200:]}")
        rc, o, e = run_tool([TRAIN, "-m", q8] + lora + ["--resume", "--out", out])
        C.check(rc == 1 and "frozen base differs" in e and base in e and q8 in e,
                f"--resume on a q8_0 copy of the base: exit 1 naming both bases (rc {rc}) {e.strip()[-300:]}")
        copy = os.path.join(tmp, "copy.gguf")
        shutil.copyfile(base, copy)
        rc, o, e = run_tool([TRAIN, "-m", copy] + lora + ["--resume", "--stop-after", "3", "--out", out])
        C.check(rc == 0 and "resume: from step 2" in o, f"--resume on the same base under another path continues (rc {rc}) {e.strip()[-200:]}")
        rc, o, e = run_tool([TRAIN, "-m", base] + lora + ["--resume", "--base-type", "f32", "--out", out])
        C.check(rc == 0 and "resume: from step 3" in o, f"--resume with --base-type f32 of the same file continues (rc {rc}) {e.strip()[-200:]}")

        pre = ["--preset", "tiny", "--lora-rank", "2", "--trainable", "lora"] + common[:2] + \
              ["--ctx", "32", "--chunk", "32", "--page", "16", "--lr", "1e-2", "--eval-every", "0", "--eval-seqs", "1", "--threads", "2",
               "--steps", "3", "--save-every", "1"]
        out = os.path.join(tmp, "preset")
        rc, _, e = run_tool([TRAIN] + pre + ["--base-type", "q4_k", "--stop-after", "1", "--out", out])
        C.check(rc == 0, f"--preset tiny --base-type q4_k LoRA run (rc {rc}) {e.strip()[-200:]}")
        rc, _, e = run_tool([TRAIN] + pre + ["--base-type", "q8_0", "--resume", "--out", out])
        C.check(rc == 1 and "frozen base differs" in e and "q4_k" in e and "q8_0" in e,
                f"--resume of a --base-type q4_k random base with q8_0: exit 1 naming both (rc {rc}) {e.strip()[-300:]}")

        # a failed save leaves no complete .saving files behind
        for what, args, model_file in (("lora", lora, "adapter.gguf"), ("full", common, "model.gguf")):
            out = os.path.join(tmp, "fail-" + what)
            os.makedirs(os.path.join(out, "state.safetensors.saving"))
            rc, _, e = run_tool([TRAIN, "-m", base] + args + ["--out", out])
            C.check(rc == 1 and "state.safetensors.saving" in e, f"{what}: the failed save stops the run, exit 1 (rc {rc}) {e.strip()[-200:]}")
            left = [n for n in leftovers(out) if n != "state.safetensors.saving"]
            C.check(left == [], f"{what}: no .saving / temporary files left by the failed save ({left})")
            C.check(not os.path.exists(os.path.join(out, model_file)), f"{what}: no {model_file} (no save completed)")
            # a checkpoint, then a failing save: the checkpoint stays, nothing else is left
            shutil.rmtree(out)
            rc, _, e = run_tool([TRAIN, "-m", base] + args + ["--stop-after", "2", "--out", out])
            C.check(rc == 0, f"{what}: a checkpoint at step 2 (rc {rc}) {e.strip()[-200:]}")
            before = open(os.path.join(out, model_file), "rb").read()
            os.makedirs(os.path.join(out, "state.safetensors.saving"))
            rc, _, e = run_tool([TRAIN, "-m", base] + args + ["--resume", "--out", out])
            left = [n for n in leftovers(out) if n != "state.safetensors.saving"]
            C.check(rc == 1 and left == [] and open(os.path.join(out, model_file), "rb").read() == before,
                    f"{what}: a failing save after resume keeps the step-2 checkpoint and leaves nothing (rc {rc}, {left})")
            os.rmdir(os.path.join(out, "state.safetensors.saving"))
            rc, o, e = run_tool([TRAIN, "-m", base] + args + ["--resume", "--out", out])
            C.check(rc == 0 and "resume: from step 2" in o, f"{what}: that checkpoint still resumes (rc {rc}) {e.strip()[-200:]}")
        # a killed save's leftover model.gguf.saving is removed before the next save writes: on a
        # disk with room for one checkpoint in flight, the leftover must not make that save fail
        # (needs a small tmpfs: root only; otherwise this part says SKIPPED)
        mnt = os.path.join(tmp, "small")
        os.makedirs(mnt)
        if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", mnt], capture_output=True).returncode == 0:
            try:
                out = os.path.join(mnt, "r")
                rc, _, e = run_tool([TRAIN, "-m", base] + common + ["--stop-after", "2", "--out", out])
                C.check(rc == 0, f"tmpfs: a checkpoint at step 2 (rc {rc}) {e.strip()[-200:]}")
                st = os.statvfs(mnt)
                model_bytes = os.path.getsize(os.path.join(out, "model.gguf"))
                free = st.f_bavail * st.f_frsize
                # a leftover that fits, but leaves less room than the new model file needs while it exists
                left_bytes = free - model_bytes // 2
                C.check(left_bytes > model_bytes, f"tmpfs: room for the test ({free} bytes free, model {model_bytes})")
                with open(os.path.join(out, "model.gguf.saving"), "wb") as f:
                    f.truncate(0)
                    f.write(b"\0" * left_bytes)
                rc, o, e = run_tool([TRAIN, "-m", base] + common + ["--resume", "--out", out])
                C.check(rc == 0 and "checkpoint: step 4" in o and leftovers(out) == [],
                        f"tmpfs: --resume saves despite a killed save's model.gguf.saving ({left_bytes} bytes), which is gone (rc {rc}) "
                        f"{e.strip()[-200:]}")
            finally:
                subprocess.run(["umount", mnt], capture_output=True)
        else:
            print("SKIPPED (this part only): the leftover-space check needs root to mount a small tmpfs")

        # a run that ends on non-finite steps fails (exit 2) and names what it kept
        for save_every, want in (("1", "last good checkpoint (step 1)"), ("0", "no checkpoint was written")):
            out = os.path.join(tmp, "nan" + save_every)
            args = common[:-4] + ["--steps", "3", "--save-every", save_every, "--lr", "1e30", "--grad-clip", "0", "--warmup", "0"]
            rc, o, e = run_tool([TRAIN, "-m", base] + args + ["--out", out])
            C.check(rc == 2 and "the run ended with 2 consecutive step(s)" in e and want in e,
                    f"--save-every {save_every}, last 2 of 3 steps non-finite: exit 2, '{want}' (rc {rc}) {e.strip()[-250:]}")
        # an output folder given where its adapter.gguf / model.gguf is meant: named as a folder
        run_dir = os.path.join(tmp, "alpha8")
        for what, args in (("oomb-eval --lora DIR", [EVAL, "-m", base, "--lora", run_dir, "--data-bin", data]),
                           ("oomb-eval -m DIR", [EVAL, "-m", run_dir, "--data-bin", data]),
                           ("oomb-train -m DIR", [TRAIN, "-m", run_dir, "--data-bin", data, "--out", os.path.join(tmp, "x")]),
                           ("oomb-train --data-bin DIR", [TRAIN, "-m", base, "--data-bin", run_dir, "--out", os.path.join(tmp, "x")])):
            rc, _, e = run_tool(args)
            C.check(rc == 1 and f"'{run_dir}' is a folder, not a file" in e, f"{what}: exit 1, 'is a folder, not a file' (rc {rc}) {e.strip()[-200:]}")
    C.finish()


if __name__ == "__main__":
    main()
