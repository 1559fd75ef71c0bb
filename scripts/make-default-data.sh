#!/usr/bin/env bash
# Regenerates data/python-docs.txt.gz, the default training text of oomb-train, from Debian's
# python3.11-doc package (reStructuredText sources of the Python 3.11 documentation, PSF License).
#
# Every documentation source file under /usr/share/doc/python3.11/html/_sources (except the
# "whatsnew" change lists) is one document; documents are sorted by path (C locale) and joined
# with the literal text <|endoftext|>, which the Qwen tokenizer encodes as the end-of-text token
# (id 151643). The output is byte-for-byte reproducible (gzip -n: no name or time stamp).
#
#   scripts/make-default-data.sh [OUT]      (default: data/python-docs.txt.gz)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-data/python-docs.txt.gz}
SRC=/usr/share/doc/python3.11/html/_sources
if [ ! -d "$SRC" ]; then
  echo "make-default-data: $SRC not found; install Debian's python3.11-doc (scripts/install-deps.sh)" >&2
  exit 1
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
first=1
while IFS= read -r -d '' f; do
  if [ $first = 0 ]; then printf '<|endoftext|>' >> "$tmp"; fi
  first=0
  cat "$f" >> "$tmp"
done < <(cd "$SRC" && find . -name '*.txt' -not -path './whatsnew/*' -print0 | LC_ALL=C sort -z | sed -z "s|^\./|$SRC/|")
mkdir -p "$(dirname "$OUT")"
gzip -n -9 -c "$tmp" > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "make-default-data: $(wc -c < "$tmp") bytes of text from $(find "$SRC" -name '*.txt' -not -path "$SRC/whatsnew/*" | wc -l) files -> $OUT ($(wc -c < "$OUT") bytes)"
