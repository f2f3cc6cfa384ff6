#!/usr/bin/env bash
# Set up (see setup.sh) and run the main job: `headwise demo` on its built-in default spec.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/headwise demo "$@"
