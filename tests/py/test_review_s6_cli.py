#!/usr/bin/env python3
"""What a fresh review of 2026-12-02 found through the command line, CPU backend (each checked to fail
before its fix):

  - oomb-export -o naming its own input (-m or --lora, also through a symbolic link) is refused before
    any work; the input is left as it was (it used to be overwritten silently);
  - --lora-alpha below 0 is refused naming the option; 0 prints a note that it means scale 1
    (llama.cpp's rule for alpha 0), not 0;
  - a --lora-rank past the smaller dimension of the smallest adapted projection warns (the run goes on:
    PEFT allows it too);
  - --threads past the machine's hardware threads warns;
  - --offload-block made smaller by a small --gpu-kv-budget says so (it used to print "blocks of 1
    pages" with no word about the requested size);
  - a LoRA run on an f32 base does not call its projections quantized;
  - an empty text file given to --data is named as empty (it used to say "1 tokens"); a .jsonl file
    read as plain text gets a note pointing to --data-format chat (--preset tiny, the shipped Qwen vocabulary);
  - (2026-12-03, from the same review's list) --warmup past --steps warns that the learning rate never
    reaches --lr; the same --data file given twice (also through a symbolic link), or a file or folder
    inside another given folder, warns that it is read twice; neither warns otherwise.

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0 pass, 1 failure, 77 skipped.
"""
import hashlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_data import BIN, Checks, llama_and_ids, need_tools, run_tool, skip  # noqa: E402

TRAIN, EXPORT = (os.path.join(BIN, t) for t in ("oomb-train", "oomb-export"))
need_tools(TRAIN, EXPORT)
try:
    import gguf  # noqa: F401  (make_llama writes the base with it)
except ImportError as e:
    skip(f"{e} (needs gguf and numpy)")
C = Checks()


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-review-s6-") as tmp:
        base, data = llama_and_ids(tmp, 3000)
        common = ["-m", base, "--data-bin", data, "--ctx", "64", "--chunk", "24", "--page", "16", "--eval-every", "0",
                  "--eval-seqs", "1", "--save-every", "-1", "--steps", "1"]

        # oomb-export onto its own input
        before = sha(base)
        link = os.path.join(tmp, "link.gguf")
        os.symlink(base, link)
        for out in (base, link):
            rc, o, e = run_tool([EXPORT, "-m", base, "--out-type", "f16", "-o", out])
            C.check(rc == 1 and "is the input" in e, f"oomb-export -o {os.path.basename(out)} (the input) refused: rc {rc} {e.strip()[-200:]}")
        C.check(sha(base) == before, "the input is unchanged")
        lora_out = os.path.join(tmp, "lora")
        rc, train_out, e = run_tool([TRAIN] + common + ["--threads", "2", "--trainable", "lora", "--lora-rank", "4", "--save-every", "1", "-o", lora_out])
        C.check(rc == 0, f"a LoRA run to export (rc {rc}) {e.strip()[-200:]}")
        C.check("frozen projections kept in the file's types" in train_out and "quantized projections" not in train_out,
                "an f32 base's LoRA run does not call its projections quantized")
        adapter = os.path.join(lora_out, "adapter.gguf")
        if os.path.exists(adapter):
            before_a = sha(adapter)
            rc, o, e = run_tool([EXPORT, "-m", base, "--lora", adapter, "--out-type", "f16", "-o", adapter])
            C.check(rc == 1 and "is the input" in e and sha(adapter) == before_a, f"oomb-export -o the adapter refused, adapter unchanged: rc {rc}")

        # --lora-alpha
        rc, o, e = run_tool([TRAIN] + common + ["--threads", "2", "--trainable", "lora", "--lora-alpha", "-5", "-o", os.path.join(tmp, "neg")])
        C.check(rc == 1 and "--lora-alpha" in e, f"--lora-alpha -5 refused naming the option: rc {rc} {e.strip()[-200:]}")
        rc, o, e = run_tool([TRAIN] + common + ["--threads", "2", "--trainable", "lora", "--lora-alpha", "0", "-o", os.path.join(tmp, "zero")])
        C.check(rc == 0 and "--lora-alpha 0 means scale 1" in e, f"--lora-alpha 0 runs with a note: rc {rc} {e.strip()[-200:]}")

        # --lora-rank past the projections' size (hidden 64, KV projections 64 x 32)
        rc, o, e = run_tool([TRAIN] + common + ["--threads", "2", "--trainable", "lora", "--lora-rank", "40", "-o", os.path.join(tmp, "rank")])
        C.check(rc == 0 and "--lora-rank 40 exceeds 32" in e, f"--lora-rank 40 warns (smallest projection 32): rc {rc} {e.strip()[-300:]}")
        rc, o, e = run_tool([TRAIN] + common + ["--threads", "2", "--trainable", "lora", "--lora-rank", "8", "-o", os.path.join(tmp, "rank8")])
        C.check(rc == 0 and "exceeds" not in e, "--lora-rank 8: no warning")

        # --warmup past --steps
        rc, o, e = run_tool([TRAIN] + common + ["--threads", "2", "--warmup", "5", "--steps", "2", "-o", os.path.join(tmp, "warm")])
        C.check(rc == 0 and "--warmup 5 is more than --steps 2" in e, f"--warmup 5 --steps 2 warns: rc {rc} {e.strip()[-200:]}")
        rc, o, e = run_tool([TRAIN] + common + ["--threads", "2", "--warmup", "1", "--steps", "2", "-o", os.path.join(tmp, "warm1")])
        C.check(rc == 0 and "--warmup" not in e, f"--warmup 1 --steps 2: no warning {e.strip()[-200:]}")

        # --threads past the hardware
        hw = os.cpu_count() or 1
        rc, o, e = run_tool([TRAIN] + common + ["--threads", str(hw + 3), "-o", os.path.join(tmp, "thr")])
        C.check(rc == 0 and f"--threads {hw + 3} is more than this machine's" in e, f"--threads {hw + 3} warns: rc {rc} {e.strip()[-200:]}")

        # --offload-block shrunk by the budget (512 tokens: 32 pages of 16 KiB, the budget ~6)
        rc, o, e = run_tool([TRAIN] + common + ["--ctx", "512", "--threads", "2", "--offload", "on", "--gpu-kv-budget", "0.0001", "--offload-block", "3",
                                                "-o", os.path.join(tmp, "blk")])
        C.check(rc == 0 and "--offload-block 3: blocks of" in o, f"--offload-block 3 under a tiny budget says what it uses: rc {rc} "
                                                                  f"{[l for l in o.splitlines() if 'block' in l]}")

        # text data: an empty file; conversations without --data-format chat
        vocab = os.path.join(os.environ.get("OOMB_SOURCE_DIR", "."), "models", "qwen2.5-vocab.gguf")
        if os.path.exists(vocab):
            empty = os.path.join(tmp, "empty.txt")
            open(empty, "w").close()
            text = ["--preset", "tiny", "--vocab", vocab, "--ctx", "32", "--chunk", "16", "--page", "8", "--eval-every", "0", "--eval-split", "0", "--steps", "1",
                    "--save-every", "-1", "--threads", "2"]
            rc, o, e = run_tool([TRAIN] + text + ["--data", empty, "-o", os.path.join(tmp, "empty")])
            C.check(rc == 1 and "the text is empty" in e, f"an empty --data file is named as empty: rc {rc} {e.strip()[-200:]}")
            chat = os.path.join(tmp, "chat.jsonl")
            with open(chat, "w") as f:
                for i in range(40):
                    f.write('{"messages": [{"role": "user", "content": "hello number %d"}, {"role": "assistant", "content": "hi %d"}]}\n' % (i, i))
            rc, o, e = run_tool([TRAIN] + text + ["--data", chat, "-o", os.path.join(tmp, "chat")])
            C.check(rc == 0 and "read as plain text" in e and "--data-format chat" in e, f"a .jsonl read as text gets a note: rc {rc} {e.strip()[-300:]}")
            doc = os.path.join(tmp, "doc.txt")
            with open(doc, "w") as f:
                f.write("The quick brown fox jumps over the lazy dog. " * 40)
            doc_link = os.path.join(tmp, "doc-link.txt")
            os.symlink(doc, doc_link)
            for second in (doc, doc_link):
                rc, o, e = run_tool([TRAIN] + text + ["--data", doc, "--data", second, "-o", os.path.join(tmp, "twice")])
                C.check(rc == 0 and "names the same file or folder as --data" in e,
                        f"--data {os.path.basename(doc)} --data {os.path.basename(second)} warns: rc {rc} {e.strip()[-300:]}")
            rc, o, e = run_tool([TRAIN] + text + ["--data", doc, "--data", chat, "-o", os.path.join(tmp, "two")])
            C.check(rc == 0 and "same file" not in e and "lies inside" not in e, f"two different --data files: no warning: rc {rc} {e.strip()[-200:]}")
            docs = os.path.join(tmp, "docs")
            os.makedirs(os.path.join(docs, "sub"))
            for name in ("a.txt", os.path.join("sub", "b.txt")):
                with open(os.path.join(docs, name), "w") as f:
                    f.write("Pack my box with five dozen liquor jugs. " * 40)
            for pair in ((docs, os.path.join(docs, "a.txt")), (os.path.join(docs, "sub"), docs)):
                rc, o, e = run_tool([TRAIN] + text + ["--data", pair[0], "--data", pair[1], "-o", os.path.join(tmp, "inside")])
                C.check(rc == 0 and "lies inside --data" in e, f"--data {pair[0]} --data {pair[1]} (one inside the other) warns: rc {rc} {e.strip()[-300:]}")
        else:
            print(f"SKIPPED: the text-data checks (no {vocab})")
    C.finish()


if __name__ == "__main__":
    main()
