"""Seeded random strings for the differential tokenizer tests against HF `tokenizers` (ASCII,
every kind of Unicode whitespace, digits, combining marks, Hangul, many scripts, emoji,
contractions in any case, special tokens of Qwen2 and fragments of them, long runs).
Not a test itself (the ctest glob runs tests/py/test_*.py)."""
import random

PIECES = [
    "a", "b", "Z", "the", " the", "Hello", " world", "'s", "'S", "'LL", "'ll", "'t", "'re", "'Ve", "'d", "'m", "'x", "n't",
    " ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u1680", "\u2000",
    "\u2009", "\u200a", "\u200b", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff",
    "0", "1", "9", "42", "2024", "١", "٣", "²", "½", "Ⅻ", "①",
    "e\u0301", "\u0301", "A\u030a", "o\u0308\u0304", "\u1100\u1161", "\u1100\u1161\u11a8", "가", "한국어", "ﬁ", "Å", "Ω", "K",
    "é", "ü", "ß", "İ", "ı", "ǅ", "中文", "日本語", "ไทย", "हिन्दी", "עברית", "عربي", "Русский", "Ελληνικά", "ქართული",
    "🙂", "👩\u200d👩\u200d👧", "🤖", "🇺🇸", "😀", "✓", "€", "£",
    "!", "?", ".", ",", ";", ":", "(", ")", "[", "]", "{", "}", "<", ">", "|", "=", "+", "-", "*", "/", "\\", "\"", "'",
    "`", "~", "@", "#", "$", "%", "^", "&", "_", "...", "->", "::", "!=",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<|im_st", "<|", "|>",
    "<|fim_prefix|>", "<think>", "<<|im_end|>>",
    "x" * 70, " " * 70, "=" * 100, "\n" * 5, "ab" * 40, "0" * 30, "\u0000", "\x7f", "\ue000", "\uffff",
]
RANGES = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff), (0x900, 0x97f), (0xe00, 0xe7f),
          (0x1100, 0x11ff), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0x1f300, 0x1f64f)]


def random_cases(seed, n, extra_pieces=()):
    """n strings: a quarter runs of random code points of RANGES, the rest 1..12 PIECES."""
    pieces = PIECES + list(extra_pieces)
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        if rng.random() < 0.25:
            lo, hi = rng.choice(RANGES)
            s = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 20)))
        else:
            s = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        cases.append(s)
    return cases


def count_mismatches(hf, cases, lines, label="", shown=10):
    """Compares HF's ids of each case (add_special_tokens=False) with a line of `oomb-tokenize
    --jsonl` output; prints the first `shown` mismatches and a summary, returns their number."""
    bad = max(0, len(cases) - len(lines))  # a case the tool printed no line for
    if bad:
        print(f"MISMATCH {label}{bad} cases without an output line")
    for s, line in zip(cases, lines):
        want = hf.encode(s, add_special_tokens=False).ids
        got = [int(x) for x in line.split()]
        if want != got:
            bad += 1
            if bad <= shown:
                print(f"MISMATCH {label}{s!r}\n  hf   {want}\n  ours {got}")
    print(f"{label}{len(cases)} cases, {bad} mismatches")
    return bad
