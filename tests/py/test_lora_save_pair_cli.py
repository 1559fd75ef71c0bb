#!/usr/bin/env python3
"""The LoRA checkpoint's two formats stay one checkpoint (oomb-train --trainable lora), CPU backend:

  - every save writes the adapter's weights hash into adapter_model.safetensors (metadata
    oomb_weights_hash), equal to state.safetensors' weights_hash; another step's differs;
  - a save killed between the PEFT renames and adapter.gguf's (simulated: the step-2 PEFT files
    placed beside the step-1 adapter.gguf + state.safetensors, with the step-2 adapter.gguf.saving and
    state.safetensors.saving left as a killed save leaves them) is resumed from step 1 (the complete
    checkpoint), and --resume rewrites the PEFT files from adapter.gguf, saying so: afterwards they
    hold exactly the step-1 tensors and hash (checked with --stop-after 1: nothing trained, nothing saved);
  - PEFT files missing beside a checkpoint are rewritten the same way; matching ones are left as they are;
  - the resumed run then continues as if never interrupted: its step-2 files equal the straight run's.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0 pass, 1 failure, 77 skipped.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, Checks, llama_and_ids, need_modules, need_tools, run_tool  # noqa: E402

TRAIN = os.path.join(BIN, "oomb-train")
need_tools(TRAIN)
safe_open = need_modules("numpy", "gguf", "safetensors")[2].safe_open  # numpy and gguf: make_llama
C = Checks()
ST, CFG = "adapter_model.safetensors", "adapter_config.json"


def meta(path, key):
    with safe_open(path, "np") as f:
        return (f.metadata() or {}).get(key)


def tensors(path):
    with safe_open(path, "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def same(a, b):
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-lora-pair-") as tmp:
        base, data = llama_and_ids(tmp, 6000)
        args = [TRAIN, "-m", base, "--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--lr", "3e-2", "--warmup", "1",
                "--eval-seqs", "1", "--eval-every", "0", "--threads", "2", "--seed", "5", "--trainable", "lora", "--lora-rank", "4",
                "--steps", "3", "--save-every", "1"]
        one, two, straight = (os.path.join(tmp, n) for n in ("one", "two", "straight"))
        rc1, _, e1 = run_tool(args + ["--out", one, "--stop-after", "1"])
        rc2, _, e2 = run_tool(args + ["--out", straight, "--stop-after", "2"])
        C.check(rc1 == 0 and rc2 == 0, f"runs to step 1 and step 2 {e1.strip()[-200:]} {e2.strip()[-200:]}")
        if rc1 or rc2:
            C.finish()
        shutil.copytree(straight, two)
        h1, h2 = meta(os.path.join(one, ST), "oomb_weights_hash"), meta(os.path.join(two, ST), "oomb_weights_hash")
        C.check(h1 is not None and h1 == meta(os.path.join(one, "state.safetensors"), "weights_hash"),
                f"step 1: the PEFT file's oomb_weights_hash {h1} == the state's weights_hash")
        C.check(h2 is not None and h2 == meta(os.path.join(two, "state.safetensors"), "weights_hash") and h2 != h1,
                f"step 2: its own hash {h2}, not step 1's")
        t1 = tensors(os.path.join(one, ST))
        C.check(not same(t1, tensors(os.path.join(two, ST))), "the step-1 and step-2 PEFT tensors differ")

        # the killed save: step-2 PEFT files renamed, step-2 adapter.gguf / state still "*.saving"
        for n in (ST, CFG):
            shutil.copyfile(os.path.join(two, n), os.path.join(one, n))
        shutil.copyfile(os.path.join(two, "adapter.gguf"), os.path.join(one, "adapter.gguf.saving"))
        shutil.copyfile(os.path.join(two, "state.safetensors"), os.path.join(one, "state.safetensors.saving"))
        saved = os.path.join(tmp, "one-interrupted")
        shutil.copytree(one, saved)
        rc, o, e = run_tool(args + ["--out", one, "--resume", "--stop-after", "1"])
        C.check(rc == 0 and "resume: from step 1" in o and "belongs to other adapter weights" in o and "rewrote it" in o,
                f"--resume from the complete step-1 checkpoint, rewriting the PEFT files ({o.strip()[-300:]} {e.strip()[-200:]})")
        C.check(same(tensors(os.path.join(one, ST)), t1) and meta(os.path.join(one, ST), "oomb_weights_hash") == h1,
                "after --resume the PEFT file holds the step-1 tensors and hash (adapter.gguf's), not step 2's")
        C.check(read(os.path.join(one, "adapter.gguf")) == read(os.path.join(saved, "adapter.gguf")), "adapter.gguf stays the step-1 one")

        # matching PEFT files are left alone; missing ones are written
        rc, o, e = run_tool(args + ["--out", one, "--resume", "--stop-after", "1"])
        C.check(rc == 0 and "rewrote" not in o, f"--resume with matching PEFT files leaves them ({o.strip()[-200:]})")
        os.unlink(os.path.join(one, ST))
        rc, o, e = run_tool(args + ["--out", one, "--resume", "--stop-after", "1"])
        C.check(rc == 0 and "is missing: rewrote it" in o and same(tensors(os.path.join(one, ST)), t1),
                f"--resume with adapter_model.safetensors missing writes it from adapter.gguf ({o.strip()[-200:]})")

        # the interrupted run continues as if never stopped
        shutil.rmtree(one)
        shutil.copytree(saved, one)
        rc, o, e = run_tool(args + ["--out", one, "--resume", "--stop-after", "2"])
        C.check(rc == 0 and read(os.path.join(one, "adapter.gguf")) == read(os.path.join(straight, "adapter.gguf"))
                and same(tensors(os.path.join(one, ST)), tensors(os.path.join(straight, ST)))
                and meta(os.path.join(one, ST), "oomb_weights_hash") == h2,
                f"resumed to step 2: adapter.gguf and the PEFT files equal the straight run's ({e.strip()[-200:]})")
    C.finish()


if __name__ == "__main__":
    main()
