#!/usr/bin/env bash
# Shoal as a library: installs the build into a temporary prefix, then builds the outside
# project (tests/install/outside/) against it with find_package(Shoal) and with pkg-config, and
# runs each build on 2 ranks with the installed launcher. Checks besides: the core program links
# no OpenMPI, and no installed CMake or pkg-config file points back into the build or source tree.
#
#   install_test.sh BUILD_DIR [--with-train]
# Exit status 0 only if every step succeeded; each failure says which step.
set -euo pipefail
build=$(cd "$1" && pwd)
train=OFF
if [ "${2:-}" = "--with-train" ]; then train=ON; fi
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() {
  echo "install_test: FAILED: $*" >&2
  exit 1
}

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || fail "cmake --install"
for f in include/shoal/run/init.h include/shoal/comm/collectives.h lib/cmake/Shoal/ShoalConfig.cmake \
  lib/pkgconfig/shoal.pc bin/shoal; do
  [ -e "$prefix/$f" ] || fail "the install has no $f"
done
if grep -rlF -e "$src" -e "$build" "$prefix/lib/cmake" "$prefix/lib/pkgconfig"; then
  fail "installed package files name the source or build tree (above)"
fi

# The launcher's rank program must be found from the prefix alone: nothing of the build tree on
# the paths the outside builds use.
cmake -S "$here/outside" -B "$tmp/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DWITH_TRAIN=$train >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; fail "configuring the outside project"; }
cmake --build "$tmp/cmake" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "building it"; }
if ldd "$tmp/cmake/outside" | grep -i 'mpi'; then
  fail "the core program links OpenMPI (above)"
fi

run2() {  # program: its 2 ranks must each report a right sum
  local out
  out=$("$prefix/bin/shoal" run -n 2 --timeout 60 -- "$1" 2>&1) || { echo "$out"; fail "shoal run -n 2 $1"; }
  for r in 0 1; do
    grep -q "outside: rank $r of 2: sum 3 right" <<<"$out" || { echo "$out"; fail "rank $r of $1"; }
  done
}
run2 "$tmp/cmake/outside"

# pkg-config, for builds without CMake.
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs shoal) ||
  fail "pkg-config shoal"
# shellcheck disable=SC2086
c++ -O1 "$here/outside/allreduce.cpp" -o "$tmp/outside_pc" $flags 2>"$tmp/pc.log" ||
  { cat "$tmp/pc.log"; fail "building with pkg-config's flags: $flags"; }
run2 "$tmp/outside_pc"

if [ "$train" = ON ]; then
  "$tmp/cmake/outside_train" || fail "outside_train (Shoal::train)"
fi
what="the CMake package and pkg-config, 2 ranks each"
if [ "$train" = ON ]; then what="$what; Shoal::train"; fi
echo "install_test: passed ($what)"
