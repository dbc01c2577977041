#!/bin/sh
# gpu_check.sh: the checks that need a GPU, in one run, for the lent H200 machine
# (../shared/GPU.md): it has a driver, nvcc and PyTorch's CUDA libraries but no
# Debian packages, so everything is built here (`make gpu-bundle`: build/ plus the
# shared libraries and Lua files the binaries need, in gpu-libs/) and carried there.
#
#   here:   make gpu-bundle       (then `sh scripts/gpu_check.sh` says: no GPU)
#   there:  sh scripts/gpu_check.sh
#           (the device tool's run, carrying build/mp build/tests build/mpengine
#           build/bench gpu-libs; it writes into $OUT, which comes back)
#
# Steps, each bounded by `timeout`, and all of them by one budget (MP_GPU_CHECK_BUDGET,
# 470 s: under 8 minutes on the H200 whatever hangs): nvidia-smi, the environment
# (libraries found, CUDA backend loaded), the parity suite (CUDA against CPU), the C
# tests, `make bench-gpu`'s run (scripts/bench/gpu/run.sh: mpengine against PyTorch),
# and the Lua tests with MP_DEVICE=cuda and on the CPU. Each step writes
# $OUT/<step>.txt (default: build/gpu-results); $OUT/summary.txt has one line per step
# (rc, seconds, its result line). The summary and the benchmark's table also go to stdout.
# Exit status: 0 when every step that ran passed (or there is no GPU), else 1.
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/build/gpu-results}   # under build/: git-ignored
case "$OUT" in /*) ;; *) OUT=$ROOT/$OUT ;; esac
mkdir -p "$OUT" || exit 1
G=$ROOT/gpu-libs
BUDGET=${MP_GPU_CHECK_BUDGET:-470}
START=$(date +%s)
: >"$OUT/summary.txt"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }

if [ ! -x build/mpengine ] || [ ! -d "$G/lib" ]; then
  say "gpu_check: build/mpengine or gpu-libs/ missing: run \`make gpu-bundle\` here and carry build/mp build/tests build/mpengine build/bench gpu-libs"
  exit 1
fi

# ---- the environment: our libraries (unpacked), the machine's CUDA libraries ----
PY=$(command -v python3 || true)
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}
U=$(mktemp -d "${TMPDIR:-/tmp}/mpengine-gpu-libs.XXXXXX") || exit 1
trap 'rm -rf "$U"' EXIT
mkdir -p "$U/lib" "$U/fallback"
unxz_to() {   # unxz_to FILE.xz DIR
  dst=$2/$(basename "$1" .xz)
  if command -v xz >/dev/null 2>&1; then xz -dc "$1" >"$dst"
  else "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$dst"
  fi
}
for d in lib fallback; do
  for f in "$G/$d"/*.xz; do [ -f "$f" ] && unxz_to "$f" "$U/$d"; done
done
# cuBLAS and the other CUDA libraries of the machine's PyTorch (site-packages/nvidia/*/lib;
# `nvidia` is a namespace package: no __file__, but a __path__)
NV=$(timeout 60 "$PY" - 2>/dev/null <<'EOF'
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
LIBS="$G/lib:$U/lib${NV:+:$NV}"
# libstdc++/libgcc_s of the build machine only where the machine has none
if LD_LIBRARY_PATH="$LIBS" ldd build/mp/cuda.so build/mpengine 2>&1 | grep -q "not found"; then
  LIBS="$LIBS:$G/fallback:$U/fallback"
fi
export LD_LIBRARY_PATH="$LIBS${ORIG_LD_LIBRARY_PATH:+:$ORIG_LD_LIBRARY_PATH}"
export PYTHON_LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH"   # python3 and PyTorch run with the machine's own libraries
export PATH="$G/bin:$PATH"
export LUA="$G/bin/lua5.4"
export LUA_PATH="$ROOT/lua/?.lua;$ROOT/lua/?/init.lua;$G/share/lua/5.4/?.lua;$G/share/lua/5.4/?/init.lua;;"
export LUA_CPATH="$ROOT/build/?.so;$G/lib/lua/5.4/?.so;;"
export MP_TEST_BUILD="$ROOT/build"

# step NAME SECONDS COMMAND...: output to $OUT/NAME.txt, one line into the summary
failed=0
step() {
  name=$1 secs=$2
  shift 2
  left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 10 ]; then
    say "$(printf '%-22s skipped: the %ss budget is spent' "$name" "$BUDGET")"
    failed=1
    return
  fi
  [ "$secs" -gt "$left" ] && secs=$left
  t0=$(date +%s)
  timeout -k 5 "$secs" "$@" >"$OUT/$name.txt" 2>&1
  rc=$?
  dt=$(($(date +%s) - t0))
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "!! timed out after ${secs}s" >>"$OUT/$name.txt"
  # the line that says how it went: a test summary where there is one
  res=$(grep -aE 'Synthesis:|^parity: [0-9]+ passed|[0-9]+ success|^bench-gpu:|^cuda available' "$OUT/$name.txt" | tail -n 1)
  [ -n "$res" ] || res=$(grep -av '^[[:space:]]*$' "$OUT/$name.txt" | tail -n 1)
  [ "$rc" = 0 ] || failed=1
  say "$(printf '%-22s rc=%-3s %4ss  %s' "$name" "$rc" "$dt" "$(echo "$res" | cut -c1-160)")"
}

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  host: $(uname -n)  $(uname -r)"
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "python3: ${PY:-none}  $(timeout 60 env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" "${PY:-false}" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -n 1)"
  echo "nvidia lib dirs: ${NV:-none found}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "carried: $(du -cb build/mp build/tests build/mpengine build/bench gpu-libs 2>/dev/null | tail -n 1 | cut -f1) bytes"
  echo "== ldd build/mp/cuda.so"; ldd build/mp/cuda.so 2>&1
  echo "== ldd build/mpengine"; ldd build/mpengine 2>&1
} >"$OUT/env.txt" 2>&1

say "== gpu_check $(date -u '+%H:%M:%S') on $(uname -n), budget ${BUDGET}s, results in $OUT"
# MP_GPU_CHECK_FORCE=1 runs every step anyway (to try the plumbing on a machine without a GPU)
if [ -z "${MP_GPU_CHECK_FORCE:-}" ] && ! command -v nvidia-smi >/dev/null 2>&1 && [ ! -e /dev/nvidiactl ]; then
  say "gpu_check: skipped: no GPU (no nvidia-smi, no /dev/nvidiactl on $(uname -n))"
  exit 0
fi
step nvidia-smi 20 nvidia-smi
step cuda-available 30 build/mpengine -e 'print("cuda available:", mp.cuda.is_available()); if mp.cuda.is_available() then local m = mp.cuda.memory(); print("cuda memory limit", m.limit) end'
if ! grep -q "cuda available:.*true" "$OUT/cuda-available.txt"; then
  say "gpu_check: the CUDA backend did not load (build/mp/cuda.so; see $OUT/env.txt for ldd and the library path)"
  failed=1
fi
step parity 120 build/tests/parity
for t in build/tests/test_*; do
  [ -x "$t" ] && step "$(basename "$t")" 60 "$t" --short-filename
done
step bench-gpu 240 env BUILD=build sh scripts/bench/gpu/run.sh
step lua-cuda 150 env MP_DEVICE=cuda "$LUA" "$G/bin/busted" --no-auto-insulate tests/lua
step lua-cpu 120 env MP_DEVICE=cpu "$LUA" "$G/bin/busted" --no-auto-insulate tests/lua
say "== gpu_check done in $(($(date +%s) - START))s: $([ "$failed" = 0 ] && echo "all steps passed" || echo "SOME STEPS FAILED (see the files in $OUT)")"
echo
sed -n '/^== bench-gpu table/,$p' "$OUT/bench-gpu.txt" 2>/dev/null
exit "$failed"
