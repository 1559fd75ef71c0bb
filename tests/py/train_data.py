"""Training data for the CLI tests (test_train_cli.py, test_lora_cli.py): a learnable id stream."""
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
