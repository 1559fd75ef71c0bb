#!/usr/bin/env python3
"""oomb-train --data-format chat, run as a subprocess on a small JSONL with --preset tiny and the
shipped Qwen vocabulary (no chat template: ChatML without a default system message):

  - --train-on assistant: train.jsonl's n_targets of each step (one conversation per sequence,
    --seqs-per-step 1) is one of the conversations' assistant token counts (content + <|im_end|>),
    computed here independently with oomb-tokenize; the sum over an epoch equals their total;
  - --train-on all: every token of each rendered conversation but the first;
  - --chat-pack: the whole data in one sequence, n_targets = the total;
  - held-out evaluation (--eval-data) uses the same mask (eval_targets);
  - bad lines: FILE:LINE and the reason, exit 1 before training; --skip-bad-lines counts them;
    a conversation longer than --ctx stops with its line (default --chat-long error).

Environment (set by CTest): OOMB_BIN_DIR, OOMB_SOURCE_DIR. Exit 0 when all passed, 1 on a failure,
77 when a tool is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OOMB_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("OOMB_BIN_DIR") or os.path.join(SRC, "build", "bin")
TRAIN = os.path.join(BIN, "oomb-train")
TOKENIZE = os.path.join(BIN, "oomb-tokenize")
VOCAB = os.path.join(SRC, "models", "qwen2.5-vocab.gguf")

CONVS = [
    [("user", "What is 2+2?"), ("assistant", "4.")],
    [("system", "Be brief."), ("user", "Name a colour."), ("assistant", "Blue."), ("user", "Another?"), ("assistant", "Red, of course.")],
    [("user", "Say hi"), ("assistant", "Hi there! How can I help you today?")],
    [("user", "Count to three"), ("assistant", "One, two, three.")],
]

failures = []


def check(ok, what):
    print(("  ok   " if ok else "  FAIL ") + what)
    if not ok:
        failures.append(what)


def n_tokens_many(texts):
    """Token counts of texts through oomb-tokenize (the same tokenizer, special tokens parsed)."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    try:
        out = subprocess.run([TOKENIZE, "-m", VOCAB, "-f", f.name, "--jsonl"], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    lines = out.stdout.rstrip("\n").split("\n")
    assert len(lines) == len(texts), (len(lines), len(texts))
    return [len(l.split()) for l in lines]


def write_jsonl(path, convs, extra=()):
    with open(path, "w") as f:
        for c in convs:
            f.write(json.dumps({"messages": [{"role": r, "content": t} for r, t in c]}) + "\n")
        for line in extra:
            f.write(line + "\n")


def run(args, out):
    p = subprocess.run([TRAIN, "--preset", "tiny", "--vocab", VOCAB, "--data-format", "chat", "--ctx", "96", "--eval-split", "0",
                        "--save-every", "-1", "-t", "2", "-o", out] + args, capture_output=True, text=True)
    log = []
    if os.path.exists(os.path.join(out, "train.jsonl")):
        log = [json.loads(l) for l in open(os.path.join(out, "train.jsonl"))]
    return p, log


def main():
    for exe in (TRAIN, TOKENIZE):
        if not os.path.exists(exe):
            print(f"SKIPPED: {exe} not built")
            return 77
    # the expected counts, from the tokenizer alone: <|im_start|>{role}\n{content}<|im_end|>\n per message
    def count(conv, assistant_only):
        n_all, n_asst = 0, 0
        pieces = n_tokens_many([r + "\n" + t for r, t in conv])
        contents = n_tokens_many([t for r, t in conv])
        for (r, t), n_piece, n_content in zip(conv, pieces, contents):
            n_all += 1 + n_piece + 1 + 1  # <|im_start|> {role}\n{content} <|im_end|> \n
            if r == "assistant":
                n_asst += n_content + 1   # content + <|im_end|>
        return n_asst if assistant_only else n_all - 1
    want_asst = [count(c, True) for c in CONVS]
    want_all = [count(c, False) for c in CONVS]
    print("expected assistant targets", want_asst, "all", want_all)
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "chat.jsonl")
        write_jsonl(data, CONVS)
        for mode, want in (("assistant", want_asst), ("all", want_all)):
            p, log = run(["--data", data, "--steps", "4", "--train-on", mode], os.path.join(d, "out-" + mode))
            check(p.returncode == 0, f"--train-on {mode}: exit 0 ({p.stderr.strip()[-300:]})")
            got = [e["n_targets"] for e in log if "n_targets" in e]
            check(sorted(got) == sorted(want), f"--train-on {mode}: per-step n_targets {got} are the conversations' {want}")
            check(all(e["loss"] is not None and e["loss"] > 0 for e in log if "loss" in e), f"--train-on {mode}: finite losses")
        p, log = run(["--data", data, "--steps", "2", "--chat-pack", "--ctx", "256"], os.path.join(d, "out-pack"))
        got = [e["n_targets"] for e in log if "n_targets" in e]
        check(p.returncode == 0 and got == [sum(want_asst)] * 2, f"--chat-pack: one sequence with all {sum(want_asst)} targets: {got}")
        # resume keeps the data position: 4 steps straight == 2 steps, stop, --resume 2 more
        common = ["--data", data, "--steps", "4", "--train-on", "assistant", "--save-every", "1", "--out-type", "f32"]
        p1, straight = run(common, os.path.join(d, "out-straight"))
        p2, _ = run(common + ["--stop-after", "2"], os.path.join(d, "out-resumed"))
        p3, resumed = run(common + ["--resume"], os.path.join(d, "out-resumed"))
        key = lambda log: [(e["step"], e["n_targets"], e["loss"]) for e in log if "n_targets" in e]
        check(p1.returncode == 0 and p2.returncode == 0 and p3.returncode == 0 and key(straight) == key(resumed) and len(key(straight)) == 4,
              f"chat resume: the same steps, targets and losses as straight ({p3.stderr.strip()[-200:]})")
        p4, _ = run(["--data", data, "--steps", "4", "--train-on", "all", "--save-every", "1", "--resume"], os.path.join(d, "out-resumed"))
        check(p4.returncode == 1 and "--train-on differs" in p4.stderr, f"chat resume with another --train-on: refused ({p4.stderr.strip()[-200:]})")
        # held-out evaluation with the same mask
        ev = os.path.join(d, "eval.jsonl")
        write_jsonl(ev, CONVS[:2])
        p, log = run(["--data", data, "--steps", "2", "--eval-data", ev, "--eval-every", "1"], os.path.join(d, "out-eval"))
        evs = [e["eval_targets"] for e in log if "eval_targets" in e]
        check(p.returncode == 0 and evs == [want_asst[0] + want_asst[1]] * 2, f"held-out eval_targets {evs} = {want_asst[0] + want_asst[1]}")
        # bad lines
        bad_lines = [
            ("{\"messages\": [", "not JSON"),
            ("{\"text\": \"hi\"}", "no \"messages\""),
            ("{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"y\"}]}", "role \"tool\""),
            ("{\"messages\": [{\"role\": \"user\", \"content\": [1]}]}", "\"content\" is not a string"),
            ("{\"messages\": []}", "empty conversation"),
            ("{\"messages\": [{\"role\": \"user\", \"content\": \"only a question\"}]}", "no assistant turn"),
        ]
        for line, why in bad_lines:
            f = os.path.join(d, "bad.jsonl")
            write_jsonl(f, CONVS[:2], [line])
            p, log = run(["--data", f, "--steps", "1"], os.path.join(d, "out-bad"))
            check(p.returncode == 1 and f"bad.jsonl:3: " in p.stderr and why in p.stderr and "step 1" not in p.stdout,
                  f"bad line ({why}): exit 1 naming line 3 before training: {p.stderr.strip()[-200:]}")
        f = os.path.join(d, "bad.jsonl")
        write_jsonl(f, CONVS, [l for l, _ in bad_lines])
        p, log = run(["--data", f, "--steps", "1", "--skip-bad-lines"], os.path.join(d, "out-skip"))
        check(p.returncode == 0 and "skipped 6 bad line(s) of 10" in p.stdout, f"--skip-bad-lines counts: {p.stdout[-300:]}")
        p, log = run(["--data", data, "--steps", "1", "--ctx", "20"], os.path.join(d, "out-long"))
        check(p.returncode == 1 and "chat.jsonl:2: " in p.stderr and "more than --ctx 20" in p.stderr,
              f"a conversation longer than --ctx: exit 1 with its line: {p.stderr.strip()[-200:]}")
        p, log = run(["--data", data, "--steps", "1", "--ctx", "20", "--chat-long", "split", "--train-on", "all"], os.path.join(d, "out-split"))
        check(p.returncode == 0 and "split" in p.stdout, f"--chat-long split runs: {p.stderr.strip()[-200:]}")
        # (fresh review) an empty file and every line skipped say that no conversation was read; a
        # line of invalid UTF-8 says so
        f = os.path.join(d, "empty.jsonl")
        open(f, "w").close()
        p, log = run(["--data", f, "--steps", "1"], os.path.join(d, "out-empty"))
        check(p.returncode == 1 and "no conversation to train on" in p.stderr, f"an empty JSONL: {p.stderr.strip()[-200:]}")
        write_jsonl(f, [], [bad_lines[0][0]])
        p, log = run(["--data", f, "--steps", "1", "--skip-bad-lines"], os.path.join(d, "out-allskipped"))
        check(p.returncode == 1 and "no conversation to train on" in p.stderr, f"every line skipped: {p.stderr.strip()[-200:]}")
        with open(f, "wb") as fh:
            fh.write(b'{"messages": [{"role": "user", "content": "caf\xe9"}, {"role": "assistant", "content": "ok"}]}\n')
        p, log = run(["--data", f, "--steps", "1"], os.path.join(d, "out-utf8"))
        check(p.returncode == 1 and "empty.jsonl:1: " in p.stderr and "invalid UTF-8" in p.stderr, f"a non-UTF-8 line: {p.stderr.strip()[-200:]}")
        # (s6 review) a folder of chat data reads only its .jsonl / .jsonl.gz files: a README (or
        # any other file) is skipped with a note, not read as a bad JSONL file; a bad line in a
        # .jsonl of the folder still names its file and line; a folder with no .jsonl says so
        folder = os.path.join(d, "chat-folder")
        os.makedirs(os.path.join(folder, "sub"))
        write_jsonl(os.path.join(folder, "a.jsonl"), CONVS)
        with open(os.path.join(folder, "README.md"), "w") as fh:
            fh.write("# chat data\nConversations, one a line.\n")
        with open(os.path.join(folder, "sub", "notes.txt"), "w") as fh:
            fh.write("not a conversation\n")
        p, log = run(["--data", folder, "--steps", "4", "--train-on", "assistant"], os.path.join(d, "out-folder"))
        got = [e["n_targets"] for e in log if "n_targets" in e]
        check(p.returncode == 0 and "skipped 2 file(s) that are not .jsonl or .jsonl.gz" in p.stdout and "README.md" in p.stdout
              and sorted(got) == sorted(want_asst), f"a folder with a README: only a.jsonl read ({p.returncode}: {p.stdout[-300:]} {p.stderr[-300:]})")
        write_jsonl(os.path.join(folder, "sub", "b.jsonl"), CONVS[:2], [bad_lines[0][0]])
        p, log = run(["--data", folder, "--steps", "1"], os.path.join(d, "out-folder-bad"))
        check(p.returncode == 1 and "sub/b.jsonl:3: " in p.stderr and "not JSON" in p.stderr,
              f"a bad line in a folder's .jsonl: its file and line named ({p.stderr.strip()[-200:]})")
        only = os.path.join(d, "no-jsonl")
        os.makedirs(only)
        with open(os.path.join(only, "README.md"), "w") as fh:
            fh.write("nothing here\n")
        p, log = run(["--data", only, "--steps", "1"], os.path.join(d, "out-no-jsonl"))
        check(p.returncode == 1 and "holds no .jsonl or .jsonl.gz file" in p.stderr, f"a folder without .jsonl: {p.stderr.strip()[-200:]}")
        p = subprocess.run([TRAIN, "--preset", "tiny", "--data", data, "--train-on", "all"], capture_output=True, text=True)
        check(p.returncode == 1 and "--train-on needs --data-format chat" in p.stderr, "--train-on without chat data: an error")
    print("FAILED: " + "; ".join(failures) if failures else "all chat checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
