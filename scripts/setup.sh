#!/usr/bin/env bash
# Installs every build, test and benchmark dependency from Debian's packages.
# Idempotent: when everything is present it only runs dpkg queries and returns in seconds.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libssl-dev zlib1g-dev libsqlite3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libcpp-httplib-dev
  openmpi-bin libopenmpi-dev
  libtorch-dev libopenblas-dev libgloo-dev
  python3
  iproute2 iptables util-linux openssl procps etcd-server ccache
  dataset-fashion-mnist fortunes python3-torch python3-matplotlib python3-optuna
  clang-16 libclang-rt-16-dev llvm-16
  chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
