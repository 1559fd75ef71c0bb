#!/usr/bin/env python3
"""oomb-train's checks of what it saves, loads and reads (the command line, CPU backend):

  - a checkpoint never holds a value its --out-type cannot: --lr 1e5 --out-type f16 (weights beyond
    +-65504) and --lr 1e7 --out-type q8_0 (a block scale beyond f16) fail the save with exit 1 naming
    the tensor, the type and --out-type f32/bf16; no model.gguf is written, and a previous good
    checkpoint stays as it was (bytes equal) and is named as kept; --out-type f32 with an infinite
    learning rate (non-finite weights after the step) fails the same way instead of saving them;
  - --resume refuses optimizer moments with a NaN (state.safetensors edited): exit 1 naming
    token_embd.weight.adam_m, before any step; the same for a negative adam_v;
  - --out naming a file and --dump-grads naming a folder are errors before any work;
  - --data FOLDER reads each file once: a symbolic link loop (L/a/back -> L), a link to a folder
    read already (latest -> v2) and a link to a file read already (docs-link.txt -> v2/docs.txt)
    are skipped with a note; the token count equals that of the folder without the links;
  - --out inside the --data folder: the run's output folder and another run's (.lock + train.jsonl) are skipped with a
    note (a train.jsonl was read as text on --resume, so the data hash differed and --resume refused); --data equal to
    --out is an error;
  - a NUL byte or invalid UTF-8 after the first 8 KiB of a text file: an explicit file is an error
    naming the file and the offset; in a folder the file is skipped with a note naming the offset;
  - messages: an int64 --tokens id of 2^40 is named by its value; a safetensors shape whose byte
    size overflows says so; --data /dev/zero and a FIFO are "not a regular file or folder";
    --resume of a LoRA folder without --trainable lora points at adapter.gguf / --trainable lora;
    --resume --preset tiny on a checkpoint of another model is a model mismatch; a chat run on a
    model without a tokenizer does not advise --data-bin;
  - SIGTERM / SIGINT during training: the step ends, is saved, and the run exits 143 / 130 naming the signal and the
    step; --resume continues from it; a second SIGINT stops at once (killed by it) and leaves no temporary file; with --save-every -1 the first
    SIGINT stops at once (no checkpoint claimed);
  - OOMB_PROFILE_FIRST_STEP=abc, +, +-1, 1x are errors naming the variable; +1 and 0 are accepted.
  - OOMB_LCE_TILE=abc is an error naming the variable before the memory plan.
  - --out/model.gguf, state.safetensors or loss.png a folder: refused before training.
  - under ulimit -v 100000 the run ends with an error (the memory plan's, naming the address-space limit, where the
    process gets that far; was: a hang in OpenBLAS), or SKIPPED where the build's libraries do not load under it.
  - --eval-data naming the training data prints a warning and the run goes on.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR, OOMB_FIXTURES_DEFAULT. Exit 0 pass, 1 failure, 77 skipped.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, SRC, Checks, make_bin, make_llama, need_fixture, need_modules, need_tools, run_tool  # noqa: E402

TRAIN, CONVERT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-convert-hf"))
VOCAB = os.path.join(SRC, "models", "qwen2.5-vocab.gguf")
need_tools(TRAIN, CONVERT)
need_modules("gguf", "numpy")
C = Checks()


def tail(s, n=300):
    return s.strip()[-n:]


def st_tensor_offset(path, name):
    """(absolute offset, dtype) of a tensor's data in a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    return 8 + n + hdr[name]["data_offsets"][0], hdr[name]["dtype"]


def write_safetensors(path, name, dtype, shape, data):
    hdr = json.dumps({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, len(data)]}}).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + data)


def text(n_words, seed):
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    return " ".join(words[(i * 7 + seed) % len(words)] for i in range(n_words)) + "\n"


def data_tokens(out):
    """The 'data: N tokens' count of an oomb-train stdout."""
    for line in out.splitlines():
        if line.startswith("data: "):
            return int(line.split()[1])
    return None


def signal_after_steps(args, steps, sigs, delay=0.0):
    """Runs args, sends each of sigs (0.3 s apart) `delay` seconds after `steps` step lines were printed; (rc, stdout,
    stderr, the last step printed)."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, last, out = 0, 0, []
    for line in p.stdout:
        out.append(line)
        if line.startswith("step "):
            seen += 1
            last = int(line.split()[1].split("/")[0])
            if seen >= steps:
                break
    time.sleep(delay)
    for i, sig in enumerate(sigs):
        if i:
            time.sleep(0.3)
        p.send_signal(sig)
    o, e = p.communicate(timeout=120)
    o = "".join(out) + o
    steps_done = [int(line.split()[1].split("/")[0]) for line in o.splitlines() if line.startswith("step ")]
    return p.returncode, o, e, (steps_done[-1] if steps_done else last)


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-train-robust-") as tmp:
        micro = os.path.join(tmp, "micro.gguf")
        rc, o, e = run_tool([CONVERT, need_fixture("qwen2-micro"), "-o", micro])
        if rc != 0:
            sys.exit(f"FAIL: oomb-convert-hf: {o}{e}")
        ids = os.path.join(tmp, "ids.bin")
        make_bin(ids, 20000, 4096)
        base = ["-m", micro, "--data-bin", ids, "--ctx", "128", "--chunk", "64", "--page", "16", "--threads", "2", "--eval-every", "0"]

        # values the --out-type cannot hold: the save fails, naming tensor and type; nothing replaced
        for lr, ot, want in (("1e5", "f16", "beyond F16's range"), ("1e7", "q8_0", "scale overflows f16")):
            out = os.path.join(tmp, "ovf-" + ot)
            rc, o, e = run_tool([TRAIN] + base + ["--steps", "2", "--save-every", "1", "--lr", lr, "--warmup", "0", "--out-type", ot,
                                                  "--out", out])
            C.check(rc == 1 and "cannot save tensor '" in e and ot.upper() in e and want in e and "--out-type" in e and
                    "no checkpoint was written" in e and "last good checkpoint" not in e,
                    f"--lr {lr} --out-type {ot}: exit 1 naming the tensor, {ot.upper()} and --out-type (rc {rc}) {tail(e)}")
            C.check(not os.path.exists(os.path.join(out, "model.gguf")), f"--out-type {ot}: no model.gguf written")
        # a good checkpoint at step 1, then a step whose weights f16 cannot hold: step 1's files stay
        out = os.path.join(tmp, "keep")
        args = base + ["--steps", "2", "--save-every", "1", "--warmup", "0", "--out-type", "f16", "--out", out]
        rc, o, e = run_tool([TRAIN] + args + ["--lr", "1e-3", "--stop-after", "1"])
        C.check(rc == 0, f"a good f16 checkpoint at step 1 (rc {rc}) {tail(e)}")
        before = [open(os.path.join(out, f), "rb").read() for f in ("model.gguf", "state.safetensors")]
        rc, o, e = run_tool([TRAIN] + args + ["--lr", "1e6", "--resume"])
        after = [open(os.path.join(out, f), "rb").read() for f in ("model.gguf", "state.safetensors")]
        C.check(rc == 1 and "step 2 not saved" in e and "the last good checkpoint (step 1)" in e and before == after,
                f"step 2 beyond f16: exit 1, step 1's checkpoint kept byte for byte and named (rc {rc}) {tail(e)}")
        C.check(not [n for n in os.listdir(out) if ".saving" in n], "the failed save leaves no .saving file")
        # non-finite weights after a step (an infinite learning rate as a float): never saved, even as f32
        out = os.path.join(tmp, "inf-f32")
        rc, o, e = run_tool([TRAIN] + base + ["--steps", "1", "--lr", "1e39", "--warmup", "0", "--grad-clip", "0", "--out-type", "f32",
                                              "--out", out])
        C.check(rc != 0 and not os.path.exists(os.path.join(out, "model.gguf")) and "checkpoint was written" in e,
                f"--lr 1e39 --out-type f32: no checkpoint of non-finite weights (rc {rc}) {tail(e)}")

        # a NaN optimizer moment is refused at --resume, naming the tensor
        out = os.path.join(tmp, "rs")
        common = base + ["--steps", "6", "--lr", "1e-3", "--out", out]
        rc, o, e = run_tool([TRAIN] + common + ["--stop-after", "3"])
        C.check(rc == 0, f"checkpoint at step 3 (rc {rc}) {tail(e)}")
        st = os.path.join(out, "state.safetensors")
        off, dt = st_tensor_offset(st, "token_embd.weight.adam_m")
        with open(st, "r+b") as f:
            f.seek(off + 4 * 5)
            f.write(struct.pack("<f", float("nan")) if dt == "F32" else b"\xc0\x7f")
        model_before = open(os.path.join(out, "model.gguf"), "rb").read()
        rc, o, e = run_tool([TRAIN] + common + ["--resume", "--save-every", "1"])
        C.check(rc == 1 and "token_embd.weight.adam_m" in e and "NaN" in e and "element 5" in e and "step 4" not in o,
                f"--resume with a NaN in adam_m: exit 1 naming the tensor before any step (rc {rc}) {tail(e)}")
        C.check(open(os.path.join(out, "model.gguf"), "rb").read() == model_before, "the checkpoint is left as it was")
        # a negative second moment (adam_v is a sum of squares) is refused the same way (was accepted: NaN weights after the step)
        with open(st, "r+b") as f:
            f.seek(off + 4 * 5)
            f.write(struct.pack("<f", 0.0) if dt == "F32" else b"\x00\x00")
        off_v, dt_v = st_tensor_offset(st, "token_embd.weight.adam_v")
        with open(st, "r+b") as f:
            f.seek(off_v + (4 if dt_v == "F32" else 2) * 7)
            f.write(struct.pack("<f", -1e-3) if dt_v == "F32" else b"\x83\xba")
        rc, o, e = run_tool([TRAIN] + common + ["--resume", "--save-every", "1"])
        C.check(rc == 1 and "token_embd.weight.adam_v" in e and "negative second moment" in e and "element 7" in e and "step 4" not in o,
                f"--resume with a negative adam_v: exit 1 naming the tensor before any step (rc {rc}) {tail(e)}")
        # --out naming a file, and --dump-grads naming a folder: errors before any work
        rc, o, e = run_tool([TRAIN] + base + ["--steps", "1", "--out", ids])
        C.check(rc == 1 and "is a regular file, not a folder" in e, f"--out a file: an error naming it (rc {rc}) {tail(e)}")
        tokens = os.path.join(need_fixture("qwen2-micro"), "reference-short.safetensors")
        rc, o, e = run_tool([TRAIN, "-m", micro, "--tokens", tokens, "--chunk", "16", "--page", "8", "--threads", "2", "--dump-grads", tmp])
        C.check(rc == 1 and "--dump-grads " + tmp + " is a directory" in e, f"--dump-grads a folder: refused up front (rc {rc}) {tail(e)}")

        # symbolic links in a --data folder: each file read once, loops not re-entered, a note
        tiny = ["--preset", "tiny", "--vocab", VOCAB, "--ctx", "32", "--chunk", "32", "--page", "16", "--steps", "1", "--threads", "2",
                "--eval-every", "0", "--eval-split", "0", "--save-every", "-1"]
        plain = os.path.join(tmp, "plain")
        os.makedirs(os.path.join(plain, "v2"))
        os.makedirs(os.path.join(plain, "a"))
        with open(os.path.join(plain, "v2", "docs.txt"), "w") as f:
            f.write(text(400, 1))
        with open(os.path.join(plain, "a", "other.txt"), "w") as f:
            f.write(text(300, 2))
        rc, o, e = run_tool([TRAIN] + tiny + ["--data", plain, "--out", os.path.join(tmp, "o-plain")])
        n_plain = data_tokens(o)
        C.check(rc == 0 and n_plain, f"--data folder without links (rc {rc}, {n_plain} tokens) {tail(e)}")
        # --out inside the --data folder: the run's own folder (train.jsonl) and another run's (a sweep side by side: .lock +
        # train.jsonl) are not read as data, so --resume finds the same data (was: the data hash differed and --resume
        # refused); --out equal to --data is an error naming both
        own = os.path.join(tmp, "own")
        shutil.copytree(plain, own)
        run = [TRAIN] + tiny[:-2] + ["--data", own, "--save-every", "1"]  # tiny less its --save-every -1
        i = run.index("--steps")
        del run[i:i + 2]  # tiny's --steps 1
        rc, o, e = run_tool(run + ["--out", os.path.join(own, "runA"), "--steps", "3", "--stop-after", "1"])
        C.check(rc == 0 and data_tokens(o) == n_plain, f"--out inside --data: run A (rc {rc}, {data_tokens(o)} vs {n_plain} tokens) {tail(e)}")
        rc, o, e = run_tool(run + ["--out", os.path.join(own, "runB"), "--steps", "3", "--stop-after", "1"])
        C.check(rc == 0 and data_tokens(o) == n_plain and "an oomb-train output folder" in o,
                f"--out inside --data: run B leaves run A's folder out ({data_tokens(o)} vs {n_plain} tokens, rc {rc}) {tail(o)} {tail(e)}")
        rc, o, e = run_tool(run + ["--out", os.path.join(own, "runA"), "--steps", "3", "--resume"])
        C.check(rc == 0 and "the run's output folder" in o and data_tokens(o) == n_plain and "resume: from step 1" in o,
                f"--out inside --data: --resume of run A finds the same data (rc {rc}) {tail(o)} {tail(e)}")
        rc, o, e = run_tool([TRAIN] + tiny + ["--data", own, "--out", own])
        C.check(rc == 1 and "is the run's output folder" in e, f"--data equal to --out: an error naming it (rc {rc}) {tail(e)}")
        os.symlink(plain, os.path.join(plain, "a", "back"))
        os.symlink("v2", os.path.join(plain, "latest"))
        os.symlink("v2/docs.txt", os.path.join(plain, "docs-link.txt"))
        rc, o, e = run_tool([TRAIN] + tiny + ["--data", plain, "--out", os.path.join(tmp, "o-links")])
        n_links = data_tokens(o)
        C.check(rc == 0 and n_links == n_plain, f"--data folder with a link loop and links to a read file / folder: {n_links} tokens, "
                                                f"as without them ({n_plain}) (rc {rc}) {tail(e)}")
        C.check("note: skipping folder '" in o and "a/back" in o and "the same file as" in o,
                f"the skipped links are noted: {[l for l in o.splitlines() if 'skipping' in l]}")
        # a hard link is a second name someone made (e.g. to weight a file twice): read under both names
        hard = os.path.join(tmp, "hard")
        os.makedirs(hard)
        with open(os.path.join(hard, "a.txt"), "w") as f:
            f.write(text(400, 1))
        rc, o, e = run_tool([TRAIN] + tiny + ["--data", hard, "--out", os.path.join(tmp, "o-hard1")])
        n_one = data_tokens(o)
        os.link(os.path.join(hard, "a.txt"), os.path.join(hard, "b.txt"))
        rc, o, e = run_tool([TRAIN] + tiny + ["--data", hard, "--out", os.path.join(tmp, "o-hard2")])
        n_two = data_tokens(o)
        C.check(rc == 0 and n_one and n_two == 2 * n_one and "skipping" not in o,
                f"--data folder with a hard link: both names read ({n_two} tokens against {n_one} for one) (rc {rc}) {tail(e)}")
        # the Hugging Face cache's layout: snapshots/<rev>/train.jsonl a link to an extensionless blob that sorts
        # first; the extension filter decides before the links, so train.jsonl is read (chat data)
        hub = os.path.join(tmp, "hub")
        os.makedirs(os.path.join(hub, "blobs"))
        os.makedirs(os.path.join(hub, "snapshots", "r1"))
        with open(os.path.join(hub, "blobs", "0a1b2c"), "w") as f:
            for i in range(40):
                f.write(json.dumps({"messages": [{"role": "user", "content": "question %d" % i},
                                                 {"role": "assistant", "content": "answer %d" % i}]}) + "\n")
        os.symlink("../../blobs/0a1b2c", os.path.join(hub, "snapshots", "r1", "train.jsonl"))
        rc, o, e = run_tool([TRAIN, "--preset", "tiny", "--vocab", VOCAB, "--data-format", "chat", "--data", hub, "--ctx", "32",
                             "--chunk", "32", "--page", "16", "--steps", "1", "--threads", "2", "--eval-every", "0", "--eval-split", "0",
                             "--save-every", "-1", "--out", os.path.join(tmp, "o-hub")])
        C.check(rc == 0 and "holds no" not in e, f"--data on a Hugging Face cache layout (a .jsonl link to a blob) trains (rc {rc}) {tail(e)}")

        # bytes that are not text after the first 8 KiB
        head = text(2000, 3).encode()[:10000]
        for what, bad, want in (("NUL", b"\0", "a NUL byte at offset 10000"), ("UTF-8", b"\xff", "invalid UTF-8 at offset 10000")):
            d = os.path.join(tmp, "bad-" + what)
            os.makedirs(d)
            p = os.path.join(d, "late.txt")
            with open(p, "wb") as f:
                f.write(head + bad + head)
            with open(os.path.join(d, "good.txt"), "w") as f:
                f.write(text(400, 4))
            rc, o, e = run_tool([TRAIN] + tiny + ["--data", p, "--out", os.path.join(tmp, "o-bad")])
            C.check(rc == 1 and p in e and want in e, f"{what} at offset 10000 of an explicit file: exit 1 naming file and offset (rc {rc}) {tail(e)}")
            rc, o, e = run_tool([TRAIN] + tiny + ["--data", d, "--out", os.path.join(tmp, "o-bad")])
            C.check(rc == 0 and f"note: skipping '{p}': not a text file ({want})" in o,
                    f"{what} at offset 10000 of a folder's file: skipped with a note (rc {rc}) {tail(o)}")

        # a device or a FIFO given to --data
        fifo = os.path.join(tmp, "fifo")
        os.mkfifo(fifo)
        for p, kind in (("/dev/zero", "a character device"), (fifo, "a FIFO")):
            rc, o, e = run_tool([TRAIN] + tiny + ["--data", p, "--out", os.path.join(tmp, "o-dev")])
            C.check(rc == 1 and f"'{p}' is not a regular file or folder ({kind})" in e and "no such file" not in e,
                    f"--data {p}: not a regular file or folder (rc {rc}) {tail(e)}")
        # an int64 --tokens id beyond int32 is named by its value
        tok = os.path.join(tmp, "tokens.safetensors")
        write_safetensors(tok, "input_ids", "I64", [1, 4], struct.pack("<4q", 1, 2, 1 << 40, 3))
        rc, o, e = run_tool([TRAIN, "-m", micro, "--dump-grads", os.path.join(tmp, "g.safetensors"), "--tokens", tok])
        C.check(rc == 1 and "token id 1099511627776 at position 2" in e, f"--tokens id 2^40: named by its value (rc {rc}) {tail(e)}")
        # a shape whose byte size overflows 64 bits
        write_safetensors(tok, "input_ids", "I64", [(1 << 61) + 32], b"\0" * 256)
        rc, o, e = run_tool([TRAIN, "-m", micro, "--dump-grads", os.path.join(tmp, "g.safetensors"), "--tokens", tok])
        C.check(rc == 1 and "overflows" in e and "needs 256" not in e, f"--tokens shape x dtype overflowing: said so (rc {rc}) {tail(e)}")
        # --resume of a LoRA folder without --trainable lora
        llama = os.path.join(tmp, "llama.gguf")
        make_llama(llama)
        lids = os.path.join(tmp, "lids.bin")
        make_bin(lids, 4000, 512)
        lora_args = ["-m", llama, "--data-bin", lids, "--ctx", "64", "--chunk", "32", "--page", "16", "--threads", "2", "--eval-every", "0",
                     "--steps", "2", "--out", os.path.join(tmp, "lora")]
        rc, o, e = run_tool([TRAIN] + lora_args + ["--trainable", "lora", "--stop-after", "1"])
        C.check(rc == 0, f"a LoRA checkpoint (rc {rc}) {tail(e)}")
        rc, o, e = run_tool([TRAIN] + lora_args + ["--resume"])
        C.check(rc == 1 and "adapter.gguf" in e and "--trainable lora" in e, f"--resume of a LoRA folder without --trainable lora (rc {rc}) {tail(e)}")
        # --resume --preset tiny on a checkpoint of another model (micro)
        out = os.path.join(tmp, "micro-ck")
        rc, o, e = run_tool([TRAIN] + base + ["--steps", "2", "--stop-after", "1", "--lr", "1e-3", "--out", out])
        C.check(rc == 0, f"a checkpoint of micro (rc {rc}) {tail(e)}")
        rc, o, e = run_tool([TRAIN, "--preset", "tiny", "--data-bin", ids, "--ctx", "128", "--chunk", "64", "--page", "16", "--steps", "2",
                             "--resume", "--out", out])
        C.check(rc == 1 and "another model than --preset tiny" in e and "tokenizer has" not in e,
                f"--resume --preset tiny on micro's checkpoint: a model mismatch (rc {rc}) {tail(e)}")
        # chat data on a model without a tokenizer: advice that works (not --data-bin)
        chat = os.path.join(tmp, "chat.jsonl")
        with open(chat, "w") as f:
            f.write(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n")
        rc, o, e = run_tool([TRAIN, "-m", micro, "--data-format", "chat", "--data", chat, "--ctx", "32", "--out", os.path.join(tmp, "o-chat")])
        C.check(rc == 1 and "--vocab" in e and "--data-bin" not in e, f"chat run, model without tokenizer: no --data-bin advice (rc {rc}) {tail(e)}")

        # a stop signal: the first ends the step, saves it and exits 128 + signal; --resume continues; a second stops at once
        sig_out = os.path.join(tmp, "sig")
        long_run = [TRAIN] + base + ["--steps", "100000", "--log-every", "1", "--out", sig_out]
        for sig, want_rc in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
            shutil.rmtree(sig_out, ignore_errors=True)
            rc, o, e, n = signal_after_steps(long_run, 3, [sig])
            C.check(rc == want_rc and f"stopped by {sig.name} after step {n}/100000: --resume continues" in o and
                    f"checkpoint: step {n} ->" in o, f"{sig.name} after step {n}: exit {want_rc} with a checkpoint (rc {rc}) {tail(o)} {tail(e)}")
        rc, o, e = run_tool([TRAIN] + base + ["--steps", str(n + 2), "--out", sig_out, "--resume"])
        C.check(rc == 0 and f"resume: from step {n} " in o and f"step {n + 2}/{n + 2}" in o,
                f"--resume after the stop continues from step {n} (rc {rc}) {tail(o)} {tail(e)}")
        # --resume with a -m that does not exist: an error (was: a "changed" note, and the run went on without it)
        missing_m = [a if a != micro else os.path.join(tmp, "nope.gguf") for a in base]
        rc, o, e = run_tool([TRAIN] + missing_m + ["--steps", str(n + 3), "--out", sig_out, "--resume"])
        C.check(rc == 1 and "-m:" in e and "nope.gguf" in e and "step " not in o,
                f"--resume -m nope.gguf: an error naming it (rc {rc}) {tail(o)} {tail(e)}")
        shutil.rmtree(sig_out, ignore_errors=True)
        slow = [a if a != "128" else "8192" for a in long_run]  # --ctx 8192: steps of ~10 s, so both signals land in step 2
        rc, o, e, n = signal_after_steps(slow, 1, [signal.SIGINT, signal.SIGINT], delay=0.5)
        C.check(rc == -signal.SIGINT and not [f for f in os.listdir(sig_out) if ".tmp." in f or ".saving" in f],
                f"a second SIGINT stops at once, no temporary file left (rc {rc}) {tail(e)}")

        # --save-every -1 writes no checkpoint, so a first SIGINT stops at once (was: "stopping after this step with a
        # checkpoint", untrue, and a wait for the whole step)
        shutil.rmtree(sig_out, ignore_errors=True)
        rc, o, e, n = signal_after_steps(slow + ["--save-every", "-1"], 1, [signal.SIGINT], delay=0.5)
        C.check(rc == -signal.SIGINT and "with a checkpoint" not in e and "stopped by" not in o and
                not os.path.exists(os.path.join(sig_out, "state.safetensors")),
                f"--save-every -1: a SIGINT stops at once, no checkpoint claimed (rc {rc}) {tail(o)} {tail(e)}")

        # a checkpoint file of --out that is a folder: refused before training (was: found at the first save, after it)
        for f in ("model.gguf", "state.safetensors", "loss.png"):
            o_dir = os.path.join(tmp, "o-dirs-" + f.split(".")[0])
            os.makedirs(os.path.join(o_dir, f), exist_ok=True)
            r = subprocess.run([TRAIN] + base + ["--steps", "1", "--out", o_dir], capture_output=True, text=True, timeout=120)
            C.check(r.returncode == 1 and f"{f}' is a folder, not a file" in r.stderr and "step 1" not in r.stdout,
                    f"--out/{f} a folder: refused before training (rc {r.returncode}) {tail(r.stdout)} {tail(r.stderr)}")

        # under an address-space limit (ulimit -v) too small for the run: the plan refuses it naming the limit, before
        # OpenBLAS's first product (which retries its failed buffer allocation forever: a hang), and the error's exit is
        # not held up by OpenBLAS's teardown. A CUDA build cannot even load its libraries under such a limit: SKIPPED then.
        # (97 MiB: below the run's ~133 MiB with OpenBLAS's buffer, so any machine's process refuses it or fails earlier.)
        import resource
        lim = 100000 * 1024
        r = subprocess.run([TRAIN] + base + ["--steps", "1", "--save-every", "-1", "--out", os.path.join(tmp, "o-as")], capture_output=True,
                           text=True, timeout=120, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (lim, lim)))
        if "error while loading shared libraries" in r.stderr:
            print("[  SKIPPED ] ulimit -v 100000: this build's libraries do not load under the limit (a CUDA build)")
        else:
            C.check(r.returncode == 1 and "error:" in r.stderr and "step 1" not in r.stdout,
                    f"ulimit -v 100000: an error, not a hang (rc {r.returncode}) {tail(r.stdout)} {tail(r.stderr)}")
            if "address-space limit (ulimit -v)" not in r.stderr:
                print(f"note: ulimit -v 100000: failed before the memory plan on this machine: {tail(r.stderr)}")

        # OOMB_PROFILE_FIRST_STEP must be a number ("+1" as the strtol-read OOMB_CUDA_* variables take it)
        for val, ok in (("abc", False), ("+", False), ("+-1", False), ("1x", False), ("+1", True), ("0", True)):
            env = dict(os.environ, OOMB_PROFILE_FIRST_STEP=val)
            r = subprocess.run([TRAIN] + base + ["--steps", "1", "--save-every", "-1", "--out", os.path.join(tmp, "o-prof")],
                               capture_output=True, text=True, env=env)
            if ok:
                C.check(r.returncode == 0, f"OOMB_PROFILE_FIRST_STEP={val}: accepted (rc {r.returncode}) {tail(r.stderr)}")
            else:
                C.check(r.returncode == 1 and f"OOMB_PROFILE_FIRST_STEP={val}:" in r.stderr and "step 1" not in r.stdout,
                        f"OOMB_PROFILE_FIRST_STEP={val}: an error naming it, before any step (rc {r.returncode}) {tail(r.stderr)}")
        # --eval-data that is the training data: a warning naming both, and the run goes on
        r = subprocess.run([TRAIN] + base + ["--steps", "1", "--save-every", "-1", "--eval-data", ids, "--out", os.path.join(tmp, "o-evsame")],
                           capture_output=True, text=True)
        C.check(r.returncode == 0 and f"warning: --eval-data {ids} is the training data {ids}" in r.stderr,
                f"--eval-data equal to --data-bin: a warning, the run goes on (rc {r.returncode}) {tail(r.stdout)} {tail(r.stderr)}")
        # OOMB_LCE_TILE (the LM head's vocabulary tile) is checked before the model loads, not in step 1
        env = dict(os.environ, OOMB_LCE_TILE="abc")
        r = subprocess.run([TRAIN] + base + ["--steps", "1", "--save-every", "-1", "--out", os.path.join(tmp, "o-lce")],
                           capture_output=True, text=True, env=env)
        C.check(r.returncode == 1 and "OOMB_LCE_TILE = 'abc'" in r.stderr and "step 1" not in r.stdout and "memory plan" not in r.stdout,
                f"OOMB_LCE_TILE=abc: an error naming it, before the plan (rc {r.returncode}) {tail(r.stdout)} {tail(r.stderr)}")
    C.finish()


if __name__ == "__main__":
    main()
