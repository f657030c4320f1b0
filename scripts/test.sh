#!/usr/bin/env bash
# Set-up, build, and every test. The README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 900 "$@"
