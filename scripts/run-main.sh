#!/usr/bin/env bash
# The main job. Until the trainer exists this runs the embedding example.
set -euo pipefail
B=${1:-build}
if [ -x "$B/bin/oomb-train" ]; then exec "$B/bin/oomb-train"; fi
exec "$B/bin/oomb-embed-example"
