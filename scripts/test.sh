#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite that needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> running tests"
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600
