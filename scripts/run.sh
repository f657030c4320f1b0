#!/usr/bin/env bash
# Set-up, build, and the main job (the README's run command): data-parallel training of a CNN on
# Fashion-MNIST across 2 local ranks, one intra-op thread each.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
exec build/shoal run -n "${SHOAL_RANKS:-2}" -- build/fashion_mnist \
  --metrics build/fashion_mnist_metrics.jsonl --checkpoint-dir build/checkpoints "$@"
