#!/usr/bin/env bash
# The test suite under sanitizers, each in a build directory of its own (gcc, like build/).
#
#   scripts/sanitize.sh asan [ctest args]   AddressSanitizer + UndefinedBehaviorSanitizer, in
#                                           build-asan/: the engine's test binaries (below)
#   scripts/sanitize.sh tsan [gtest args]   ThreadSanitizer, in build-tsan/: the thread-rank
#                                           collective tests (shoal_collective_tests; by default
#                                           a few minutes' selection, --gtest_filter=* for all)
#   scripts/sanitize.sh tsan-processes [ctest args]
#                                           ThreadSanitizer, in build-tsan/: the ASan run's tests
#                                           (below: ranks as processes, the store, the parameter
#                                           servers, the launcher), every process instrumented,
#                                           without the tests whose assertions are deadlines
#                                           (SHOAL_TSAN_EXCLUDE, a ctest regex, says which: TSan
#                                           slows a rank 5-15x). About 5 minutes here.
#
# What the ASan run covers: every test that needs no libtorch and no outside launcher:
# shoal_unit_tests, shoal_collective_tests, shoal_process_tests, shoal_launcher_tests, shoal_lazy_tests,
# shoal_encryption_tests, shoal_ps_tests, shoal_ps_replication_tests, shoal_ps_compression_tests,
# shoal_host_discovery_tests, shoal_trace_tests, shoal_flight_tests, shoal_tensorboard_tests,
# shoal_sweep_tests (with the programs they start, also instrumented) and shoal_serve_core_tests
# (shoal-serve's batching queue, request JSON and metrics), shoal_etcd_store_tests (the etcd
# store's parsing, and its TLS client against a real etcd: etcd_store_config, etcd_store_tls).
# Left out: the libtorch tests
# (shoal_train_tests, shoal_train_process_tests: Debian's libtorch is not instrumented, and
# compiling the train layer twice more would double CI's build time) and the tests that run
# outside programs (mpirun_*, the Slurm stand-in, the network-namespace test: OpenMPI's own
# allocations would be reported as leaks; their Shoal code paths are the ones the process tests
# run).
# Both build directories are configured without libtorch and OpenMPI (SHOAL_WITH_TORCH=OFF,
# SHOAL_WITH_MPI=OFF): the engine as a user who only needs collectives builds it, so this stage
# also shows that build works and its tests pass.
# Any sanitizer report fails the test that triggered it (-fno-sanitize-recover, halt_on_error).
# Exit status: ctest's (or the test binary's).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${1:-}
shift || true
JOBS=${SHOAL_BUILD_JOBS:-$(nproc)}
source scripts/compiler_cache.sh

configure() {  # build dir, sanitizers
  bash scripts/setup.sh
  cmake -S "$ROOT" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_SANITIZE="$2" \
    -DSHOAL_BUILD_BENCH=OFF -DSHOAL_WITH_TORCH=OFF -DSHOAL_WITH_MPI=OFF "${LAUNCHER[@]}" >/dev/null
}

# The engine's test binaries and the programs they start (no libtorch, no outside launcher).
ENGINE_TARGETS=(shoal_unit_tests shoal_collective_tests shoal_process_tests shoal_launcher_tests
  shoal_encryption_tests shoal_ps_tests shoal_lazy_tests shoal_ps_compression_tests
  shoal_ps_replication_tests shoal_host_discovery_tests shoal_trace_tests shoal_trace_worker
  shoal_flight_tests shoal_flight_worker shoal_test_worker shoal_tensorboard_tests shoal_sweep_tests
  shoal_sweep_fake_trainer shoal shoal_ps_worker shoal_serve_core_tests shoal_etcd_store_tests)
# Tests of binaries not built here (the libtorch ones) appear as <target>_NOT_BUILT; the
# libtorch examples' own tests (pipeline_example_*, gpt_example_*) and etcd_store (its jobs run
# the libtorch elastic worker) are left out by name, as are those that run outside programs.
NOT_HERE='_NOT_BUILT$|^install_|^mpirun_|^multihost_|^slurm_|^pipeline_example_|^gpt_example_|^etcd_store$'

case "$MODE" in
  asan)
    BUILD=$ROOT/build-asan
    configure "$BUILD" address,undefined
    cmake --build "$BUILD" --parallel "$JOBS" --target "${ENGINE_TARGETS[@]}"
    # Child processes inherit these. print_stacktrace: UBSan's report says where.
    export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    cd "$BUILD"
    # SHOAL_ASAN_EXCLUDE: more tests to leave out (a ctest regex), e.g. the timing-bound ones.
    # Two tests at a time (SHOAL_ASAN_JOBS): the sanitized ranks spend much of their time waiting
    # on each other, and what remains bounds time only where the bound is structural (a failure
    # report's fixed budgets) or relative (a bootstrap against its own clean run).
    ctest --output-on-failure --timeout 900 -j "${SHOAL_ASAN_JOBS:-2}" \
      -E "$NOT_HERE${SHOAL_ASAN_EXCLUDE:+|$SHOAL_ASAN_EXCLUDE}" "$@"
    ;;
  tsan)
    BUILD=$ROOT/build-tsan
    configure "$BUILD" thread
    cmake --build "$BUILD" --parallel "$JOBS" --target shoal_collective_tests
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
    # Without arguments, a selection that takes a few minutes here (ThreadSanitizer slows the
    # thread-rank matrix about 20x): the work, point-to-point and failure-policy tests, group
    # re-creation, and every collective × algorithm × type at 2 and 4 ranks over both transports.
    if [ $# -eq 0 ]; then
      set -- --gtest_filter='Work.*:P2p*:FailurePolicy.*:Generations.*:*CollectiveMatrix*n2:*CollectiveMatrix*n4'
    fi
    "$BUILD/tests/shoal_collective_tests" "$@"
    ;;
  tsan-processes)
    BUILD=$ROOT/build-tsan
    configure "$BUILD" thread
    cmake --build "$BUILD" --parallel "$JOBS" --target "${ENGINE_TARGETS[@]}"
    # Child processes inherit it: a race in any rank ends that rank (exit 66), failing its test.
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
    cd "$BUILD"
    # The thread-rank collective matrices are the tsan mode's (a selection); the timing-bound
    # tests run in the normal stage.
    EXCLUDE=${SHOAL_TSAN_EXCLUDE-FaultInjection|StoreHost|LauncherStop|CollectiveMatrix|HierarchicalMatrix}
    ctest --output-on-failure --timeout 1200 -j "${SHOAL_TSAN_JOBS:-2}" \
      -E "$NOT_HERE${EXCLUDE:+|$EXCLUDE}" "$@"
    ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan|tsan-processes [args]" >&2
    exit 2
    ;;
esac
