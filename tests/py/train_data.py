"""Training data and logs for the CLI tests (test_train_cli.py, test_lora_cli.py): a learnable id stream."""
import json
import os
import random
import struct


def make_bin(path, n, vocab, seed=0):
    """A learnable id stream: a noisy cyclic pattern, little-endian uint32."""
    r = random.Random(seed)
    ids, x = [], 1
    for _ in range(n):
        x = (x * 5 + 3) % 61 if r.random() > 0.1 else r.randrange(vocab)
        ids.append(x)
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{n}I", *ids))
    return ids


def read_log(out):
    """OUT/train.jsonl as ([(step, train loss)], [(step, held-out loss)])."""
    train, ev = [], []
    with open(os.path.join(out, "train.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j:
                train.append((j["step"], j["loss"]))
            if "eval_loss" in j:
                ev.append((j["step"], j["eval_loss"]))
    return train, ev
