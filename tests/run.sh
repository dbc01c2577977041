#!/bin/sh
# Runs every test: the Criterion binaries in $BUILD/tests, the parity harness,
# then the busted specs in tests/lua through `require "mp"` from plain lua5.4,
# on the default device, on the fake CUDA device and on the emulated CUDA
# device (the backend's own .cu code on the host: tests/emu). Ends with one line
# `N passed, N failed` (`, N skipped` where any were skipped); exits 1 on failure.
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.." || exit 1
# the emulated CUDA device, built where the CUDA toolkit's headers are
EMU="$PWD/$BUILD/tests/emu_cuda.so"
[ -f "$EMU" ] || EMU=
EMU_COV=$(mktemp)
# SAN=1 (make test SAN=1): the build is instrumented with ASan and UBSan; lua5.4,
# busted's interpreter, is not, so the sanitizers' runtimes are preloaded into it
# and into every child. Any report fails the test that caused it (UBSan halts;
# ASan and LeakSanitizer exit non-zero); tests/lsan.supp names what is not ours.
if [ "${SAN:-}" = 1 ]; then
  CC=${CC:-cc}
  LD_PRELOAD="$($CC -print-file-name=libasan.so) $($CC -print-file-name=libubsan.so)"
  export LD_PRELOAD
  # intercept_tls_get_addr=0: LeakSanitizer (GCC 12) crashes walking the dynamic
  # TLS of OpenMP's workers once a dlopen'ed library (oneDNN, under lua5.4) has
  # thread-locals ("Tracer caught signal 11", then no leak check at all); without
  # the interception it leaves dynamic TLS out of its roots and checks the rest
  export ASAN_OPTIONS="detect_leaks=1:exitcode=23:strict_string_checks=1:detect_stack_use_after_return=0:intercept_tls_get_addr=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=24"
  export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
  # the interop test's Python packages: those of the plain build when it has them
  [ -x build/pyenv/bin/python3 ] && export MP_TEST_PYTHON="$PWD/build/pyenv/bin/python3"
fi
pass=0 fail=0 skip=0
log=$(mktemp) && trap 'rm -f "$log" "$EMU_COV"' EXIT
# the emulated device's settings: launch sites that ran go to EMU_COV
EMU_ENV="MP_CUDA_BACKEND=$EMU MP_NCCL_LIBRARY=$EMU MP_EMU_COVERAGE=$EMU_COV"

for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  echo "== $t"
  # the tests that take a device (test_ops) get the emulated one
  if [ -n "$EMU" ]; then env $EMU_ENV "$t" --short-filename >"$log" 2>&1
  else "$t" --short-filename >"$log" 2>&1; fi
  rc=$?
  grep -v '^\[----\]' "$log" | tail -n 20
  line=$(grep 'Synthesis:' "$log" | tail -n 1)
  if [ -z "$line" ]; then echo "!! $t exited $rc without a summary"; fail=$((fail + 1)); continue; fi
  n_pass=$(echo "$line" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
  n_fail=$(echo "$line" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p')
  n_crash=$(echo "$line" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p')
  n_skip=$(echo "$line" | sed -n 's/.*Skipped: \([0-9]*\).*/\1/p')
  pass=$((pass + ${n_pass:-0})); fail=$((fail + ${n_fail:-0} + ${n_crash:-0})); skip=$((skip + ${n_skip:-0}))
done

# backend parity (tests/parity): the harness against planted faults, then the CUDA
# backend against the CPU one, each case skipped where there is no CUDA device,
# then every case on the emulated CUDA device: the .cu kernels themselves, each
# launch run with its threads in three orders (forward, reversed, shuffled) and
# compared byte for byte (MP_EMU_RACECHECK). Where the emulator is not built,
# every case through the fake device's table instead (its kernels are the CPU's:
# that checks the harness and the calls through a second backend object).
emu_mode=emu
[ -n "$EMU" ] || { emu_mode=fake; echo "== the emulated CUDA device is not built (no CUDA headers at /usr/local/cuda/include): its passes are skipped"; }
for mode in --self-check "" $emu_mode; do
  [ -x "$BUILD/tests/parity" ] || { echo "!! $BUILD/tests/parity missing"; fail=$((fail + 1)); break; }
  echo "== parity $mode"
  if [ "$mode" = emu ]; then
    env $EMU_ENV MP_EMU_RACECHECK=1 "$BUILD/tests/parity" >"$log" 2>&1
  elif [ "$mode" = fake ]; then
    [ -f "$BUILD/tests/fake_cuda.so" ] || { echo "!! $BUILD/tests/fake_cuda.so missing"; fail=$((fail + 1)); continue; }
    MP_CUDA_BACKEND="$PWD/$BUILD/tests/fake_cuda.so" MP_FAKE_CUDA_PROTECT=1 "$BUILD/tests/parity" >"$log" 2>&1
  else
    "$BUILD/tests/parity" $mode >"$log" 2>&1
  fi
  rc=$?
  grep -v '^FAIL' "$log" | tail -n 3
  [ "$mode" != --self-check ] && grep '^FAIL' "$log" | head -n 20
  line=$(grep -a '^parity: [0-9]* passed' "$log" | tail -n 1)
  if [ -z "$line" ]; then echo "!! parity $mode exited $rc without a summary"; fail=$((fail + 1)); continue; fi
  set -- $line
  pass=$((pass + $2)); fail=$((fail + $4)); skip=$((skip + $6))
  [ "$rc" -ne 0 ] && [ "$4" -eq 0 ] && { echo "!! parity $mode exited $rc"; fail=$((fail + 1)); }
done

export LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;;"
export LUA_CPATH="$PWD/$BUILD/?.so;;"
export MP_TEST_BUILD="$PWD/$BUILD"
# lua_pass LABEL [NAME=VALUE...] [-- BUSTED-ARGS...]: the specs once, in an environment
lua_pass() {
  label=$1; shift
  vars=""
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do vars="$vars $1"; shift; done
  [ "${1:-}" = "--" ] && shift
  echo "== busted tests/lua ($label)"
  env $vars busted --output=utfTerminal --no-auto-insulate "$@" tests/lua >"$log" 2>&1
  grep -av "^$" "$log" | tail -n 60
  line=$(grep -aE "[0-9]+ success" "$log" | tail -n 1)
  if [ -z "$line" ]; then
    echo "!! busted printed no summary"; fail=$((fail + 1))
  else
    n() { echo "$line" | sed -n "s/.*\([^0-9]\|^\)\([0-9][0-9]*\) $1.*/\2/p"; }
    pass=$((pass + $(n success))); fail=$((fail + $(n failure) + $(n error))); skip=$((skip + $(n pending)))
  fi
}
lua_pass "the default device"
# again on build/tests/fake_cuda.so, the CPU-backed double of the CUDA backend
# (tests/device/fake_cuda.c), with device memory closed to the host outside
# its kernels: what a GPU machine's MP_DEVICE=cuda run would meet outside the
# kernels themselves. memory_spec's 50,000-tensor loop runs there unprotected
# (mprotect per op would take minutes).
FAKE="MP_DEVICE=cuda MP_CUDA_BACKEND=$PWD/$BUILD/tests/fake_cuda.so"
# The specs that only run child processes (which stay on the cpu) are left out.
lua_pass "cuda on the fake device" $FAKE MP_FAKE_CUDA_PROTECT=1 -- --exclude-pattern=memory_spec \
  --exclude-pattern=amp_scripts_spec --exclude-pattern=train_spec --exclude-pattern=cli_spec --exclude-pattern=repl_spec \
  --exclude-pattern=thread_bits_spec
lua_pass "cuda on the fake device, memory_spec" $FAKE -- --pattern=memory_spec
# and on the emulated device: the backend's own kernels, runtime and library
# calls (threads in a shuffled order), memory_spec included; dist_spec's
# emulated-device cases run in the first pass (they start their own processes)
if [ -n "$EMU" ]; then
  lua_pass "cuda on the emulated device" MP_DEVICE=cuda $EMU_ENV MP_EMU_ORDER=shuffle -- \
    --exclude-pattern=amp_scripts_spec --exclude-pattern=train_spec --exclude-pattern=cli_spec --exclude-pattern=repl_spec \
    --exclude-pattern=thread_bits_spec
  # which of the backend's kernels and launch sites the passes ran, of all
  env -u LD_PRELOAD sh tests/emu/coverage.sh "$EMU_COV"   # (make test SAN=1: not the sanitizers' runtimes)
else
  skip=$((skip + 1))
fi

if [ "$skip" -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"
else echo "$pass passed, $fail failed"; fi
[ "$fail" -eq 0 ]
