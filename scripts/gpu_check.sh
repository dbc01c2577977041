#!/bin/sh
# gpu_check.sh: the checks that need a GPU, in one run of a few minutes on the
# lent H200 machine (docs/ARCHITECTURE.md, "The GPU check"). That machine has a
# driver, nvcc and PyTorch's CUDA libraries but no Debian packages, so everything
# is built here and carried there as one folder (`make gpu-bundle`: gpu-libs/, the
# stripped binaries of these steps, the shared libraries and Lua files they need,
# compressed; scripts/gpu_bundle.sh).
#
#   here:   make gpu-check        (builds and bundles, then says: no GPU)
#           MP_GPU_CHECK_FORCE=1 make gpu-check
#                                 walks every step anyway, the emulated CUDA
#                                 device (build/tests/emu_cuda.so: the .cu code on
#                                 the host; the fake device where it is not built)
#                                 standing in for the GPU and bench-gpu in its
#                                 smoke mode: the plumbing, the counts and the
#                                 summary, tried here
#   there:  sh scripts/gpu_check.sh
#           (the device tool's run, carrying gpu-libs; it writes into $OUT,
#           which comes back)
#
# Steps, most informative first, each under its own timeout and all of them
# under one budget (MP_GPU_CHECK_BUDGET, 360 s):
#   nvidia-smi, cuda-load (the backend loads, or why not; one op round trip),
#   parity (CUDA against the CPU, op by op), then compute-sanitizer where the
#   machine has it: memcheck over every parity case, racecheck (shared memory
#   hazards; scripts/gpu_racecheck.sh sorts them into mpengine's kernels and
#   NVIDIA's libraries') and synccheck (barriers and warp operations misused)
#   over the cases of the kernels with shared memory and barriers; lua-cuda
#   (the Lua specs with MP_DEVICE=cuda, scripts/gpu_specs.sh: one busted run
#   per file, the device's files first, as many as fit in MP_GPU_CHECK_SPECS
#   seconds (200), the others named; TAP: one line per test even when killed;
#   the specs that only start CPU child processes are CI's), nccl-one (mp.dist's
#   NCCL path with one rank: the collectives on every dtype, and a data-parallel
#   f16 step without a host read; multi-GPU runs need a machine with more than
#   one GPU), bench-gpu,
#   bench-gpt (GPT-2 small at batch 4, 3 steps, eager PyTorch only: a size that
#   fits what is left of the budget; `make bench-gpu` runs the whole table).
# Each step writes $OUT/<step>.txt (default: build/gpu-results) beginning with
# the command it ran; $OUT/summary.txt gets one line per step as it ends:
#   step, rc, seconds, passed/failed/skipped, the first failure's text.
# MP_GPU_CHECK_SKIP="STEP ...": leaves those steps out (a rerun that needs only
# some of them, in what is left of a lease). MP_GPU_CHECK_NCU=1 adds two last
# steps: ncu-attention, Nsight Compute's speed-of-light, launch and occupancy
# sections for the first attention kernels of bench_gpu.lua's attention row;
# ncu-cnn, every kernel's time (gpu__time_duration) over 300 launches of the
# CNN row's steps after its first 300, summed per kernel.
# Exit status: 0 when every step passed (or there is no GPU), else 1.
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/build/gpu-results}   # under build/: git-ignored
case "$OUT" in /*) ;; *) OUT=$ROOT/$OUT ;; esac
mkdir -p "$OUT" || exit 1
G=$ROOT/gpu-libs
BUDGET=${MP_GPU_CHECK_BUDGET:-360}
SPECS_S=${MP_GPU_CHECK_SPECS:-200}
START=$(date +%s)
: >"$OUT/summary.txt"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }

if [ ! -d "$G/build" ] || [ ! -d "$G/lib" ]; then
  say "gpu_check: gpu-libs/ missing or old: run \`make gpu-bundle\` here and carry gpu-libs"
  exit 1
fi

HAVE_GPU=
if command -v nvidia-smi >/dev/null 2>&1 || [ -e /dev/nvidiactl ]; then HAVE_GPU=1; fi
FORCE=${MP_GPU_CHECK_FORCE:-}
[ "$FORCE" = 0 ] && FORCE=
say "== gpu_check $(date -u '+%H:%M:%S') on $(uname -n), budget ${BUDGET}s, results in $OUT"
if [ -z "$HAVE_GPU" ] && [ -z "$FORCE" ]; then
  say "gpu_check: skipped: no GPU (no nvidia-smi, no /dev/nvidiactl on $(uname -n)); MP_GPU_CHECK_FORCE=1 walks the steps on the emulated device"
  exit 0
fi

# ---- the environment: the bundle unpacked, the machine's CUDA libraries ----
PY=$(command -v python3 || true)
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}
U=$(mktemp -d "${TMPDIR:-/tmp}/mpengine-gpu-libs.XXXXXX") || exit 1
trap 'rm -rf "$U"' EXIT
unxz_to() {   # unxz_to FILE.xz DEST
  if command -v xz >/dev/null 2>&1; then xz -dc "$1" >"$2"
  else "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
  fi
}
# every file of gpu-libs at the same place under $U, the compressed ones unpacked
(cd "$G" && find . -type f) | while read -r f; do
  mkdir -p "$U/$(dirname "$f")"
  case "$f" in
    *.xz) unxz_to "$G/$f" "$U/${f%.xz}" ;;
    *) cp "$G/$f" "$U/$f" ;;
  esac
done
chmod +x "$U/build/mpengine" "$U/build/tests/parity" "$U/build/bench/gpu_kernels" "$U/bin/lua5.4" "$U/bin/busted" 2>/dev/null
B=$U/build
# cuBLAS, cuDNN, NCCL and the other CUDA libraries of the machine's PyTorch
# (site-packages/nvidia/*/lib; `nvidia` is a namespace package: no __file__, but a __path__)
NV=$(timeout 60 "${PY:-false}" - 2>/dev/null <<'EOF'
import glob, os
dirs = []
try:
    import nvidia
    roots = list(getattr(nvidia, "__path__", []))
except ImportError:
    roots = []
for r in roots:
    dirs += glob.glob(os.path.join(r, "*", "lib")) + glob.glob(os.path.join(r, "*", "*", "lib"))
print(":".join(d for d in sorted(set(dirs)) if glob.glob(os.path.join(d, "*.so*"))))
EOF
)
LIBS="$U/lib${NV:+:$NV}"
# libstdc++/libgcc_s of the build machine only where the machine has none
if LD_LIBRARY_PATH="$LIBS" ldd "$B/mp/cuda.so" "$B/mpengine" 2>&1 | grep -q "not found"; then
  LIBS="$LIBS:$U/fallback"
fi
export LD_LIBRARY_PATH="$LIBS${ORIG_LD_LIBRARY_PATH:+:$ORIG_LD_LIBRARY_PATH}"
export PYTHON_LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH"   # python3 and PyTorch run with the machine's own libraries
export PATH="$U/bin:$PATH"
export LUA="$U/bin/lua5.4"
export LUA_PATH="$ROOT/lua/?.lua;$ROOT/lua/?/init.lua;$U/share/lua/5.4/?.lua;$U/share/lua/5.4/?/init.lua;;"
export LUA_CPATH="$B/?.so;$U/lib/lua/5.4/?.so;;"
export MP_TEST_BUILD="$B"
SLOW=1
if [ -z "$HAVE_GPU" ]; then   # MP_GPU_CHECK_FORCE without a GPU: the emulated device stands in
  export MP_BENCH_SMOKE=1
  # the emulator runs the steps several times slower than a GPU (the Lua specs alone
  # take 7-8 minutes on it on a 2-core AVX2 VM, make test's emulated pass 436-441 s):
  # every step's timeout and the budget grow by this factor, so that a forced walk
  # ends each step instead of timing it out (no device time is spent here)
  SLOW=${MP_GPU_CHECK_SLOW:-6}
  BUDGET=$((BUDGET * SLOW))
  if [ -f "$ROOT/build/tests/emu_cuda.so" ]; then
    export MP_CUDA_BACKEND="$ROOT/build/tests/emu_cuda.so" MP_NCCL_LIBRARY="$ROOT/build/tests/emu_cuda.so"
    say "gpu_check: MP_GPU_CHECK_FORCE without a GPU: the emulated device (build/tests/emu_cuda.so) stands in for it, bench-gpu in smoke mode, timeouts and the budget x${SLOW}; nothing here measures a GPU"
  else
    export MP_CUDA_BACKEND="$ROOT/build/tests/fake_cuda.so" MP_FAKE_CUDA_COLL=1
    say "gpu_check: MP_GPU_CHECK_FORCE without a GPU: build/tests/fake_cuda.so stands in for it, bench-gpu in smoke mode, timeouts and the budget x${SLOW}; nothing here measures a GPU"
  fi
fi
SANITIZER=$(command -v compute-sanitizer 2>/dev/null)
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
         /opt/cuda/bin/compute-sanitizer; do
  [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER=$c
done

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  host: $(uname -n)  $(uname -r)  cores: $(nproc 2>/dev/null)"
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "python3: ${PY:-none}  $(timeout 60 env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" "${PY:-false}" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -n 1)"
  echo "nvidia lib dirs: ${NV:-none found}"
  echo "compute-sanitizer: ${SANITIZER:-none}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "carried: $(du -cb "$G" 2>/dev/null | tail -n 1 | cut -f1) bytes (gpu-libs), unpacked: $(du -cb "$U" | tail -n 1 | cut -f1)"
  echo "== ldd cuda.so"; ldd "$B/mp/cuda.so" 2>&1
  echo "== ldd mpengine"; ldd "$B/mpengine" 2>&1
} >"$OUT/env.txt" 2>&1

# ---- what each step's output says: counts and the first failure ----
# counts KIND FILE -> "P passed, F failed, S skipped" (empty when it printed none)
counts() {
  case $1 in
    parity) grep -a '^parity: [0-9]* passed' "$2" | tail -n 1 | sed 's/^parity: //' ;;
    criterion) grep -a 'Synthesis:' "$2" | tail -n 1 |
      sed -n 's/.*Passing: \([0-9]*\).*Failing: \([0-9]*\).*Crashing: \([0-9]*\).*/\1 \2 \3/p' |
      awk '{ printf "%d passed, %d failed, 0 skipped\n", $1, $2 + $3 }' ;;
    tap) { awk '/^ok [0-9]+ - # SKIP/ { s++; next } /^ok [0-9]/ { p++ } /^not ok [0-9]/ { f++ }
                END { if (p + f + s) printf "%d passed, %d failed, %d skipped\n", p, f, s }' "$2"
           grep -a '^# lua-cuda: ' "$2" | tail -n 1 | sed 's/^# lua-cuda: /; /'; } | tr -d '\n' ;;
    racecheck) grep -a '^racecheck: ' "$2" | tail -n 1 | sed 's/^racecheck: //' ;;
    ncu) printf '%d kernel launches profiled\n' "$(grep -a -c '^==PROF== Profiling' "$2")" ;;
    memcheck) grep -a -E 'ERROR SUMMARY:|RACECHECK SUMMARY:' "$2" | tail -n 1 | sed 's/^=* *//' ;;
    bench) awk '/^== bench-gpu table/ { t = 1 } t && / met$/ { m++ } t && / MISSED$/ { x++ }
                END { if (t) printf "%d targets met, %d missed\n", m, x }' "$2" ;;
    first) sed -n '2p' "$2" | cut -c1-160 ;;   # the first line it printed
    *) ;;
  esac
}
# first_failure KIND FILE -> one line
first_failure() {
  case $1 in
    parity) grep -a -m 1 -E '^FAIL |^parity: the device is lost' "$2" ;;
    criterion) grep -a -m 1 -E '\[FAIL\]|Assertion Failed|CRASH|[Ss]ignal' "$2" ;;
    tap) awk '/^not ok/ { if (!f) { f = $0; want = 1; next } } want && /^# Failure message:/ { print f " | " $0; done = 1; exit }
              /^# spec .*: rc [1-9]/ && !crash { crash = $0 }
              END { if (f && !done) print f; else if (!f && crash) print crash }' "$2" ;;
    racecheck) grep -a -m 1 -E '^racecheck: ' "$2" ;;
    ncu) grep -a -m 1 -E '^==ERROR==|rror' "$2" ;;
    memcheck) grep -a -m 1 -E 'Invalid|Error:|error' "$2" | grep -v 'ERROR SUMMARY: 0 errors' ;;
    *) grep -a -m 1 -iE 'error|fail|!!' "$2" ;;
  esac
}

# step NAME KIND SECONDS COMMAND...: runs it under its timeout within the budget
failed=0
step() {
  name=$1 kind=$2 secs=$(($3 * SLOW))
  shift 3
  case " ${MP_GPU_CHECK_SKIP:-} " in
    *" $name "*) say "$(printf '%-16s skipped: MP_GPU_CHECK_SKIP' "$name")"; return ;;
  esac
  left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 10 ]; then
    say "$(printf '%-16s skipped: the %ss budget is spent' "$name" "$BUDGET")"
    failed=1
    return
  fi
  [ "$secs" -gt "$left" ] && secs=$left
  echo "\$ $*" | tr '\n' ' ' | sed 's/  */ /g; s/ $//' >"$OUT/$name.txt"
  echo >>"$OUT/$name.txt"
  t0=$(date +%s)
  timeout -k 5 "$secs" "$@" >>"$OUT/$name.txt" 2>&1
  rc=$?
  dt=$(($(date +%s) - t0))
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "!! timed out after ${secs}s" >>"$OUT/$name.txt"
  [ "$rc" = 0 ] || failed=1
  c=$(counts "$kind" "$OUT/$name.txt")
  f=""
  [ "$rc" = 0 ] && [ -z "$(echo "$c" | grep -E '[1-9][0-9]* failed')" ] || f=$(first_failure "$kind" "$OUT/$name.txt")
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && f="timed out after ${secs}s${f:+; $f}"
  say "$(printf '%-16s rc=%-3s %4ss  %s%s' "$name" "$rc" "$dt" "${c:-no counts}" "${f:+  first failure: $(echo "$f" | cut -c1-220)}")"
}
# skip NAME WHY COMMAND...: a step this machine cannot run, and what it would have run
skip() {
  name=$1 why=$2
  shift 2
  printf '%s\n' "would run: $*" "skipped: $why" >"$OUT/$name.txt"
  say "$(printf '%-16s skipped: %s (would run: %s)' "$name" "$why" "$*")"
}

if command -v nvidia-smi >/dev/null 2>&1; then
  step nvidia-smi first 15 sh -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader; nvidia-smi' 
else
  skip nvidia-smi "no nvidia-smi here" nvidia-smi
fi
step cuda-load first 30 "$B/mpengine" -e '
  local ok, why = mp.cuda.is_available()
  print("cuda available:", ok, why or "")
  if not ok then os.exit(1) end
  local t = mp.arange(1000, {device = "cuda"}) * 2
  print("an op round trip: sum of 2*(0..999) =", t:sum():item(), "(expected 999000)")
  local m = mp.cuda.memory()
  print("cuda memory: in_use", m.in_use, "cached", m.cached, "limit", m.limit)'
if ! grep -q "cuda available:.*true" "$OUT/cuda-load.txt"; then
  say "gpu_check: the CUDA backend did not load: $(grep -a 'cuda available' "$OUT/cuda-load.txt" | head -n 1) (see $OUT/env.txt for ldd and the library path); the device steps are left out"
  exit 1
fi
step parity parity 60 "$B/tests/parity"
# the kernels with shared memory, barriers or warp operations, for racecheck and synccheck
SHARED_CASES="reduce sum,reduce argmax,softmax,layer_norm,cross_entropy,attention,telemetry,topk,batch_norm,conv2d"
if [ -n "$SANITIZER" ] && [ -n "$HAVE_GPU" ]; then
  step parity-memcheck memcheck 75 "$SANITIZER" --tool memcheck --error-exitcode 3 --print-limit 20 "$B/tests/parity"
  step parity-racecheck racecheck 45 sh scripts/gpu_racecheck.sh "$SANITIZER" "$B/tests/parity" --only "$SHARED_CASES"
  step parity-synccheck memcheck 30 "$SANITIZER" --tool synccheck --error-exitcode 3 --print-limit 20 \
    "$B/tests/parity" --only "$SHARED_CASES"
else
  why="no compute-sanitizer on this machine"
  [ -z "$HAVE_GPU" ] && why="no GPU (the emulated device compares thread orders and checks barriers itself)"
  for tool in memcheck racecheck synccheck; do
    skip parity-$tool "$why" compute-sanitizer --tool $tool "$B/tests/parity"
  done
fi
# the specs that fit in SPECS_S seconds (x SLOW) of what is left, the device's first
specs_s=$((SPECS_S * SLOW))
left=$((BUDGET - ($(date +%s) - START) - 15))
[ "$specs_s" -gt "$left" ] && specs_s=$left
step lua-cuda tap $(((specs_s + 15) / SLOW + 1)) sh scripts/gpu_specs.sh "$specs_s"
# NCCL with one rank (no mpirun there: a world of one whose device collectives
# still go through NCCL)
step nccl-one first 60 env MP_DEVICE=cuda sh -c \
  "\"$B/mpengine\" tests/lua/dist/device_one.lua && \"$B/mpengine\" tests/lua/dist/nowait.lua"
if ! grep -q "steps 5 reads 0 copies 0 waits 0" "$OUT/nccl-one.txt"; then
  say "gpu_check: nccl-one: a data-parallel step read back on the host, or did not run (see $OUT/nccl-one.txt)"
  failed=1
fi
step bench-gpu bench 150 env BUILD="$B" MP_BENCH_GPT=0 sh scripts/bench/gpu/run.sh
# the GPT-2-small rows last, at a size that fits what is left of the budget
step bench-gpt bench 120 env BUILD="$B" MP_BENCH_GPT=only MP_BENCH_GPT_BATCH=4 MP_BENCH_GPT_STEPS=1,3,1 \
  MP_BENCH_GPT_COMPILED=0 sh scripts/bench/gpu/run.sh
if [ -n "${MP_GPU_CHECK_NCU:-}" ] && [ -n "$HAVE_GPU" ]; then
  NCU=$(command -v ncu 2>/dev/null)
  for c in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do [ -z "$NCU" ] && [ -x "$c" ] && NCU=$c; done
  if [ -n "$NCU" ]; then
    step ncu-attention ncu 120 "$NCU" --clock-control none --section SpeedOfLight --section LaunchStats \
      --section Occupancy -k 'regex:flash|attention' --launch-count 8 "$B/mpengine" scripts/bench/gpu/bench_gpu.lua attention
    step ncu-cnn ncu 120 "$NCU" --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      --launch-skip 300 --launch-count 300 "$B/mpengine" scripts/bench/gpu/bench_gpu.lua cnn
  else
    skip ncu-attention "no ncu on this machine" ncu
  fi
fi
partial=$(grep -a '^# lua-cuda: ' "$OUT/lua-cuda.txt" 2>/dev/null | grep -v ' 0 cut off by the time limit, 0 not reached' |
          sed 's/^# lua-cuda: /; lua-cuda: only /')
say "== gpu_check done in $(($(date +%s) - START))s: $([ "$failed" = 0 ] && echo "all steps passed" || echo "SOME STEPS FAILED (see the files in $OUT)")$partial"
echo
for f in "$OUT/bench-gpu.txt" "$OUT/bench-gpt.txt"; do sed -n '/^== bench-gpu table/,$p' "$f" 2>/dev/null; done
exit "$failed"
