#!/usr/bin/env python3
"""Partial LoRA adapters and --lora-init through the command line (oomb-eval, oomb-export, oomb-train), CPU:

  - a real adapter (oomb-train --trainable lora, a few steps on a small Llama base) with some pairs
    dropped with gguf-py (all of layer 0's v and down, every target of layer 1 but k and gate) loads
    in oomb-eval --lora, which applies exactly the pairs the file holds (as llama.cpp): its NLL equals
    that of the full adapter with those pairs' B set to zero (to 1e-6 relative), and differs from the
    full adapter's and from the base's; oomb-export merges the partial adapter (exit 0);
  - refused with exit 1 and a message naming the tensor: a pair for a layer the base does not have,
    a lora_a without its lora_b, a misshapen lora_b;
  - --resume on an OUT/adapter.gguf that is partial is refused (oomb-train writes complete ones);
  - --lora-init: an unknown value is refused listing default and gaussian; --lora-init without
    --trainable lora is refused; gaussian trains (exit 0); on --resume it is ignored with a warning.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0 pass, 1 failure, 77 skipped.
"""
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, Checks, llama_and_ids, need_modules, need_tools, run_tool  # noqa: E402

TRAIN, EVAL, EXPORT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-eval", "oomb-export"))
need_tools(TRAIN, EVAL, EXPORT)
np, gguf = need_modules("numpy", "gguf")
C = Checks()
# the pairs dropped from the full adapter
DROPPED = ("blk.0.attn_v.", "blk.0.ffn_down.", "blk.1.attn_q.", "blk.1.attn_v.", "blk.1.attn_output.", "blk.1.ffn_up.", "blk.1.ffn_down.")


def nll(args):
    rc, o, e = run_tool([EVAL] + args + ["--max-tokens", "512", "--ctx", "64", "--chunk", "24", "--page", "16", "--threads", "2"])
    m = re.search(r"mean NLL: ([0-9.]+)", o)
    return (float(m.group(1)) if rc == 0 and m else None), o, e


def write_adapter(src, dst, keep=lambda name: True, extra=()):
    """dst: src's adapter keys and the tensors keep() accepts, then extra (name, numpy array in torch order)."""
    r = gguf.GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(dst, arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(r.fields["adapter.lora.alpha"].parts[-1][0]))
    n = 0
    for t in r.tensors:
        if keep(t.name):
            w.add_tensor(t.name, np.array(t.data, dtype=np.float32))
            n += 1
    for name, a in extra:
        w.add_tensor(name, a)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return n


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-lora-partial-") as tmp:
        base, data = llama_and_ids(tmp, 8000)
        out = os.path.join(tmp, "run")
        common = ["-m", base, "--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--lr", "3e-2", "--warmup", "1",
                  "--eval-seqs", "1", "--eval-every", "0", "--threads", "2", "--seed", "5", "--trainable", "lora", "--lora-rank", "4"]
        rc, o, e = run_tool([TRAIN] + common + ["--steps", "6", "--save-every", "0", "--out", out])
        C.check(rc == 0, f"6 LoRA steps (rc {rc}) {e.strip()[-300:]}")
        if rc:
            C.finish()
        full = os.path.join(out, "adapter.gguf")
        dropped = lambda n: n.startswith(DROPPED)
        part = os.path.join(tmp, "partial.gguf")
        n_kept = write_adapter(full, part, lambda n: not dropped(n))
        C.check(n_kept == 2 * (14 - 7), f"the partial adapter keeps 7 of 14 pairs ({n_kept} tensors)")
        # the full adapter with the dropped pairs' B zero
        zeroed = os.path.join(tmp, "zeroed.gguf")
        shutil.copyfile(full, zeroed)
        z = gguf.GGUFReader(zeroed, "r+")
        nz = 0
        for t in z.tensors:
            if dropped(t.name) and t.name.endswith(".lora_b"):
                C.check(np.abs(np.array(t.data)).max() > 0, f"{t.name} is non-zero after training")
                t.data[...] = 0
                nz += 1
        z.data.flush()
        del z
        C.check(nz == 7, f"zeroed the B of the 7 dropped pairs ({nz})")

        base_nll, _, _ = nll(["-m", base, "--data-bin", data])
        full_nll, _, _ = nll(["-m", base, "--lora", full, "--data-bin", data])
        zero_nll, _, ez = nll(["-m", base, "--lora", zeroed, "--data-bin", data])
        part_nll, o, e = nll(["-m", base, "--lora", part, "--data-bin", data])
        C.check(part_nll is not None and "7 pairs: partial" in o, f"oomb-eval --lora PARTIAL runs and says it is partial {e.strip()[-300:]}")
        if None not in (base_nll, full_nll, zero_nll, part_nll):
            C.check(abs(part_nll - zero_nll) <= 1e-6 * zero_nll,
                    f"partial adapter NLL {part_nll:.7f} == full adapter with the dropped B zero {zero_nll:.7f}")
            C.check(abs(part_nll - full_nll) > 1e-4 and abs(part_nll - base_nll) > 1e-4,
                    f"the partial adapter differs from the full one ({full_nll:.6f}) and from the base ({base_nll:.6f}): {part_nll:.6f}")
        else:
            C.check(False, f"perplexities {base_nll} {full_nll} {zero_nll} {part_nll} {ez.strip()[-200:]}")
        merged = os.path.join(tmp, "merged.gguf")
        rc, o, e = run_tool([EXPORT, "-m", base, "--lora", part, "--out-type", "f16", "-o", merged])
        C.check(rc == 0 and os.path.exists(merged), f"oomb-export merges the partial adapter (rc {rc}) {e.strip()[-200:]}")

        # refusals, each naming the tensor
        r = gguf.GGUFReader(full)
        a0 = next(np.array(t.data, dtype=np.float32) for t in r.tensors if t.name == "blk.0.attn_q.weight.lora_a")
        b0 = next(np.array(t.data, dtype=np.float32) for t in r.tensors if t.name == "blk.0.attn_q.weight.lora_b")
        bad = os.path.join(tmp, "bad.gguf")
        for extra, keep, want in (
                ([("blk.5.attn_q.weight.lora_a", a0), ("blk.5.attn_q.weight.lora_b", b0)], lambda n: not dropped(n),
                 "tensor 'blk.5.attn_q.weight.lora_a' adapts 'blk.5.attn_q.weight', which is not a block projection"),
                ([("blk.1.attn_v.weight.lora_a", a0)], lambda n: not dropped(n), "the pair of 'blk.1.attn_v.weight' lacks its .lora_b"),
                ([("blk.0.attn_q.weight.lora_a", a0), ("blk.0.attn_q.weight.lora_b", b0[:-1])], lambda n: not n.startswith("blk.0.attn_q."),
                 "'blk.0.attn_q.weight.lora_b' ne [4, 63] do not fit 'blk.0.attn_q.weight' ne [64, 64]")):
            write_adapter(full, bad, keep, extra)
            rc, o, e = run_tool([EVAL, "-m", base, "--lora", bad, "--data-bin", data, "--max-tokens", "64"])
            C.check(rc == 1 and want in e, f"oomb-eval --lora refuses: '{want}' ({e.strip()[-220:]})")

        # --resume on a partial OUT/adapter.gguf
        shutil.copyfile(part, full)
        rc, o, e = run_tool([TRAIN] + common + ["--steps", "8", "--save-every", "0", "--out", out, "--resume"])
        C.check(rc == 1 and "is a partial adapter (layer 1's q projection has no pair" in e, f"--resume of a partial adapter: refused ({e.strip()[-220:]})")

        # --lora-init
        bad_out = os.path.join(tmp, "bad")
        rc, o, e = run_tool([TRAIN] + common + ["--steps", "1", "--out", bad_out, "--lora-init", "kaiming"])
        C.check(rc == 1 and "--lora-init: unknown value 'kaiming' (choose default or gaussian" in e, f"--lora-init kaiming: refused ({e.strip()[-200:]})")
        rc, o, e = run_tool([TRAIN, "-m", base, "--data-bin", data, "--steps", "1", "--out", bad_out, "--lora-init", "gaussian"])
        C.check(rc == 1 and "--lora-init needs --trainable lora" in e, f"--lora-init without --trainable lora: refused ({e.strip()[-200:]})")
        rc, o, e = run_tool([TRAIN, "--help"])
        C.check(rc == 0 and "--lora-init" in o and "gaussian" in o, "--help documents --lora-init")
        g = os.path.join(tmp, "gauss")
        rc, o, e = run_tool([TRAIN] + common + ["--steps", "2", "--save-every", "1", "--stop-after", "1", "--out", g, "--lora-init", "gaussian"])
        C.check(rc == 0 and os.path.exists(os.path.join(g, "adapter.gguf")), f"--lora-init gaussian trains ({e.strip()[-200:]})")

        def init_weights(d):
            with open(os.path.join(d, "adapter_config.json")) as f:
                return json.load(f).get("init_lora_weights")
        C.check(init_weights(g) == "gaussian", f"adapter_config.json after --lora-init gaussian: init_lora_weights 'gaussian' (got {init_weights(g)!r})")
        rc, o, e = run_tool([TRAIN] + common + ["--steps", "2", "--save-every", "1", "--out", g, "--lora-init", "gaussian", "--resume"])
        C.check(rc == 0 and "warning: --lora-init gaussian is ignored with --resume" in e and "resume: from step 1" in o,
                f"--resume with --lora-init: continues, with a warning that it is ignored ({e.strip()[-200:]})")
        C.check(init_weights(g) == "gaussian", f"adapter_config.json after the resume: still 'gaussian' (got {init_weights(g)!r})")
    C.finish()


if __name__ == "__main__":
    main()
