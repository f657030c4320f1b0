#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang in build-fuzz/ and runs each for a while.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   default: 15 s each, every target
#   scripts/fuzz.sh --seeds                            rewrite the seed corpus fuzz/corpus/
#
# Each target starts from the committed seeds (fuzz/corpus/<target>/, never written here) plus
# what earlier runs found (build-fuzz/corpus/<target>/, kept between runs). A crash, leak,
# sanitizer report, timeout (10 s per input) or out-of-memory (2 GiB) fails the target; the input
# is saved under build-fuzz/artifacts/<target>/ and the run goes on with the next target.
# Exit status: 0 if every target ran clean, 1 otherwise. The last lines are one summary per
# target: runs, seconds, corpus size, and the result.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$ROOT/build-fuzz
ALL=(frame store_protocol store_requests auth ps_protocol ps_request sealed_file shard_restore checkpoint idx shard_index codec
  flight_file shm_ring)

configure() {
  bash scripts/setup.sh
  source scripts/compiler_cache.sh
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++-16 -DSHOAL_FUZZ=ON -DSHOAL_BUILD_BENCH=OFF "${LAUNCHER[@]}" >/dev/null
}

if [ "${1:-}" = "--seeds" ]; then
  configure
  cmake --build "$BUILD" --parallel "${SHOAL_BUILD_JOBS:-2}" --target fuzz_make_corpus
  "$BUILD/fuzz/fuzz_make_corpus" "$ROOT/fuzz/corpus"
  exit 0
fi

SECONDS_EACH=${1:-15}
if ! [[ "$SECONDS_EACH" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: the duration must be a positive number of seconds, not '$SECONDS_EACH'" >&2
  exit 2
fi
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  if [[ " ${ALL[*]} " != *" $t "* ]]; then
    echo "fuzz.sh: unknown target '$t' (targets: ${ALL[*]})" >&2
    exit 2
  fi
done

configure
cmake --build "$BUILD" --parallel "${SHOAL_BUILD_JOBS:-2}" \
  --target $(printf 'fuzz_%s ' "${TARGETS[@]}")

# Scratch files (the targets write their inputs to files to read them back) on tmpfs: the
# decoders' writers fsync, and on disk that alone limits a target to ~60 runs a second.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  TMPDIR=$(mktemp -d /dev/shm/shoal-fuzz.XXXXXX)
  export TMPDIR
  trap 'rm -rf "$TMPDIR"' EXIT
fi
# A leak inside (uninstrumented) libtorch is libtorch's: see fuzz/lsan.supp.
export LSAN_OPTIONS=suppressions=$ROOT/fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}

summary=()
failed=0
for t in "${TARGETS[@]}"; do
  work=$BUILD/corpus/$t
  art=$BUILD/artifacts/$t
  log=$BUILD/logs/$t.log
  mkdir -p "$work" "$art" "$(dirname "$log")"
  echo "fuzz.sh: $t for ${SECONDS_EACH}s (log: $log)"
  rc=0
  # detect_leaks stays on: a decoder that leaks on bad input is a finding too.
  # A fixed seed (SHOAL_FUZZ_SEED, default 1): the same mutations in the same order on every
  # machine, so a CI run repeats what was run here instead of drawing new luck.
  # SHOAL_FUZZ_RUNS bounds the inputs too: with the seed and the committed corpus that makes a run
  # exactly repeatable (CI runs what was run here), the time staying an upper bound.
  "$BUILD/fuzz/fuzz_$t" -seed="${SHOAL_FUZZ_SEED:-1}" ${SHOAL_FUZZ_RUNS:+-runs="$SHOAL_FUZZ_RUNS"} \
    -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$art/" "$work" "$ROOT/fuzz/corpus/$t" \
    >"$log" 2>&1 || rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | awk '{print $5}' || true)
  size=$(ls "$work" | wc -l)
  if [ "$rc" -eq 0 ]; then
    result="ok"
  else
    failed=1
    result="FAILED (exit $rc; input under $art; $(grep -m1 -E 'ERROR:|fuzz [a-z_]+:|SUMMARY:' "$log" || echo 'see log'))"
    tail -n 40 "$log"
  fi
  summary+=("fuzz $t: ${runs:-?} runs in ${secs:-?}s, corpus $size new + $(ls "$ROOT/fuzz/corpus/$t" | wc -l) seeds: $result")
done
printf '%s\n' "${summary[@]}"
exit $failed
