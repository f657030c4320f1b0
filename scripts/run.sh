#!/usr/bin/env bash
# Set-up, build, and the main job. The README's run command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec build/shoal run -n "${SHOAL_DEMO_RANKS:-4}" -- build/shoal_demo "$@"
