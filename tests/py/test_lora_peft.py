#!/usr/bin/env python3
"""oomb-train --trainable lora writes HF PEFT's adapter format beside adapter.gguf, and it means the same:

  - OUT/adapter_model.safetensors holds base_model.model.model.layers.N.{self_attn,mlp}.<proj>.lora_A.weight
    [r, n_in] / .lora_B.weight [n_out, r] (F32) for every target, and OUT/adapter_config.json the
    LoRA configuration (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, target_modules, ...);
  - PeftModel.from_pretrained(HF model, OUT) on the HF folder the GGUF base was converted from
    (oomb-convert-hf) gives the same mean NLL on held-out windows as oomb-eval -m BASE --lora
    OUT/adapter.gguf (float64 in HF; 1e-4 relative), for a Qwen2 base (qwen2-mini) and a Llama base
    (llama-micro: GQA, tied; its q/k rows are permuted in the GGUF files, never in PEFT's), and for the
    Qwen2 base with --lora-alpha 0 (scale 1 as llama.cpp reads alpha 0: adapter_config.json lora_alpha = r);
  - the adapter matters: the NLL moves away from the base's by far more than the tolerance.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR, OOMB_FIXTURES. Exit 0: all passed; 1: a
failure; 77 (skip, with a SKIPPED line): peft, torch, transformers, safetensors or numpy missing, a
tool not built, or a fixture absent.
"""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import Checks, make_bin, run_tool as run, need_tools, skip  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
FIX = os.environ.get("OOMB_FIXTURES") or os.environ.get("OOMB_FIXTURES_DEFAULT") or os.path.join(SRC, "..", "shared", "fixtures")
TRAIN, EVAL, CONVERT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-eval", "oomb-convert-hf"))
CTX = 64
MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


try:
    import numpy as np
    import torch
    import transformers
    import peft
    from safetensors.numpy import load_file
except ImportError as e:
    skip(f"{e} (needs numpy, torch, transformers, peft, safetensors)")
need_tools(TRAIN, EVAL, CONVERT)
BASES = [("qwen2", os.path.join(FIX, "qwen2-mini")), ("llama", os.path.join(SRC, "tests", "fixtures", "llama-micro"))]
for _, d in BASES:
    if not os.path.isfile(os.path.join(d, "config.json")):
        skip(f"fixture {d} not found")

checks = Checks()
check = checks.check


def oomb_nll(args):
    rc, o, e = run([EVAL] + args + ["--ctx", str(CTX), "--chunk", "24", "--page", "16", "--threads", "2"])
    m = re.search(r"mean NLL: ([0-9.]+)", o)
    return (float(m.group(1)) if rc == 0 and m else None), e


def hf_nll(model, ids):
    """Mean NLL over windows of CTX ids (each its own sequence), every predicted token: as oomb-eval."""
    total, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids), CTX):
            w = torch.tensor([ids[s:s + CTX]], dtype=torch.long)
            if w.shape[1] < 2:
                continue
            logits = model(input_ids=w).logits[0, :-1].to(torch.float64)
            lp = torch.log_softmax(logits, dim=-1)
            total += -lp.gather(1, w[0, 1:, None]).sum().item()
            n += w.shape[1] - 1
    return total / n


def one_base(tmp, arch, hf_dir, alpha=8.0):
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    V, L = cfg["vocab_size"], cfg["num_hidden_layers"]
    base = os.path.join(tmp, arch + ".gguf")
    rc, o, e = run([CONVERT, hf_dir, "-o", base, "--outtype", "f32"])
    check(rc == 0, f"{arch}: oomb-convert-hf {e.strip()[-200:]}")
    if rc:
        return
    data = os.path.join(tmp, arch + "-ids.bin")
    ids = make_bin(data, 8000, V, seed=11)
    out = os.path.join(tmp, f"run-{arch}-alpha{alpha:g}")
    rank = 4
    rc, o, e = run([TRAIN, "-m", base, "--data-bin", data, "--ctx", str(CTX), "--chunk", "24", "--page", "16", "--lr", "2e-2",
                    "--warmup", "1", "--steps", "6", "--eval-every", "0", "--eval-seqs", "2", "--threads", "2", "--seed", "3",
                    "--trainable", "lora", "--lora-rank", str(rank), "--lora-alpha", str(alpha), "--save-every", "0", "--out", out])
    check(rc == 0, f"{arch}: 6 LoRA steps (rc {rc}) {e.strip()[-300:]}")
    if rc:
        return
    st_path, cfg_path = os.path.join(out, "adapter_model.safetensors"), os.path.join(out, "adapter_config.json")
    check(os.path.isfile(st_path) and os.path.isfile(cfg_path) and os.path.isfile(os.path.join(out, "adapter.gguf")),
          f"{arch}: adapter_model.safetensors + adapter_config.json beside adapter.gguf")
    check(not [f for f in os.listdir(out) if ".tmp" in f or f.endswith(".saving")], f"{arch}: no temporary files left")
    # the files as PEFT writes them
    c = json.load(open(cfg_path))
    # alpha 0 trains with scale 1 (llama.cpp's rule): PEFT (scale lora_alpha / r) needs lora_alpha = r
    want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha if alpha != 0 else float(rank), "bias": "none", "lora_dropout": 0.0,
            "fan_in_fan_out": False, "use_rslora": False, "base_model_name_or_path": base}
    check(all(c.get(k) == v for k, v in want.items()) and sorted(c.get("target_modules", [])) == sorted(m.split(".")[1] for m in MODULES),
          f"{arch}: adapter_config.json {dict((k, c.get(k)) for k in list(want) + ['target_modules'])}")
    sd = load_file(st_path)
    names = {f"base_model.model.model.layers.{l}.{m}.lora_{s}.weight" for l in range(L) for m in MODULES for s in "AB"}
    check(set(sd) == names, f"{arch}: the {len(names)} PEFT state-dict keys ({len(sd)} in the file)")
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float64).eval()
    mods = dict(hf.named_modules())
    ok = all(sd[k].dtype == np.float32 and
             (sd[k].shape == (rank, mods[k[len("base_model.model."):-len(".lora_A.weight")]].in_features) if ".lora_A." in k else
              sd[k].shape == (mods[k[len("base_model.model."):-len(".lora_B.weight")]].out_features, rank)) for k in sd)
    check(ok, f"{arch}: lora_A [r, n_in], lora_B [n_out, r], F32")
    check(all(np.any(sd[k] != 0) for k in sd if ".lora_B." in k), f"{arch}: every lora_B trained (non-zero)")

    # PEFT on the HF model == oomb-eval with adapter.gguf on the converted base, on held-out windows
    held = os.path.join(tmp, arch + "-held.bin")
    held_ids = ids[-4 * CTX:]
    np.array(held_ids, dtype="<u4").tofile(held)
    ours_base, e0 = oomb_nll(["-m", base, "--data-bin", held])
    ours, e1 = oomb_nll(["-m", base, "--lora", os.path.join(out, "adapter.gguf"), "--data-bin", held])
    check(ours is not None and ours_base is not None, f"{arch}: oomb-eval runs {e0.strip()[-200:]} {e1.strip()[-200:]}")
    theirs_base = hf_nll(hf, held_ids)
    pm = peft.PeftModel.from_pretrained(hf, out).eval()
    theirs = hf_nll(pm, held_ids)
    if ours is None or ours_base is None:
        return
    check(abs(ours_base - theirs_base) <= 1e-4 * theirs_base, f"{arch}: base NLL ours {ours_base:.6f} == HF {theirs_base:.6f}")
    check(abs(ours - theirs) <= 1e-4 * theirs, f"{arch}: base + adapter NLL ours (adapter.gguf) {ours:.6f} == HF + PEFT "
                                                f"(adapter_model.safetensors) {theirs:.6f}")
    check(abs(theirs - theirs_base) > 1e-2 * theirs_base,
          f"{arch}: the adapter changes the NLL by more than the tolerance ({theirs_base:.4f} -> {theirs:.4f})")


def main():
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="oomb-py-peft-") as tmp:
        for arch, d in BASES:
            print(f"{arch}: {d}")
            one_base(tmp, arch, d)
        arch, d = BASES[0]
        print(f"{arch}: {d}, --lora-alpha 0")
        one_base(tmp, arch, d, alpha=0.0)
    checks.finish()


if __name__ == "__main__":
    main()
