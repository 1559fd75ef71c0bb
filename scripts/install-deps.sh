#!/usr/bin/env bash
# Installs the Debian packages (and the few PyPI packages the tests use) that
# ggml-oomb needs, only where they are missing. Safe to run repeatedly.
#   scripts/install-deps.sh          build + test dependencies
#   scripts/install-deps.sh --build  build dependencies only
set -euo pipefail

pkgs=(build-essential cmake pkg-config git
      libopenblas-dev libpcre2-dev libutf8proc-dev nlohmann-json3-dev libcli11-dev libstb-dev zlib1g-dev
      libgtest-dev python3 python3-pip)
if [ "${1:-}" != "--build" ]; then
  pkgs+=(python3.11-doc)   # real English text for the tokenizer benchmark / default training data
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing missing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || {
    # Packages that vary between Debian releases are optional.
    echo "install-deps: retrying without optional packages"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      $(printf '%s\n' "${missing[@]}" | grep -v python3.11-doc) >/dev/null
  }
fi

if [ "${1:-}" != "--build" ]; then
  # Python packages used by interoperability tests (llama.cpp's `gguf`, numpy, safetensors).
  py=python3
  if ! $py -c "import gguf, numpy, safetensors, tokenizers" 2>/dev/null; then
    echo "install-deps: installing Python test packages (gguf numpy safetensors tokenizers)"
    $py -m pip install -q gguf numpy safetensors tokenizers 2>/dev/null \
      || $py -m pip install -q --break-system-packages gguf numpy safetensors tokenizers
  fi
fi
echo "install-deps: ok"
