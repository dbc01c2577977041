#!/bin/sh
# gpu_check.sh: the checks that need a GPU, in one run, for the lent H200 machine
# (../shared/GPU.md): it has nvcc and PyTorch's CUDA libraries but no Debian -dev
# packages, so everything is built here (`make gpu-bundle`: build/ plus the shared
# libraries and Lua files the binaries need, in gpu-libs/) and carried there.
#
#   here:   make gpu-bundle
#   there:  sh scripts/gpu_check.sh        (the device tool's run, carrying
#           build/mp build/tests build/mpengine build/bench gpu-libs)
#
# Results go to $OUT (or ./gpu-results): nvidia-smi, the parity suite (CUDA
# against CPU), the C tests, the Lua tests on the CPU and with MP_DEVICE=cuda,
# and the MLP benchmark on both devices. Each step is bounded in time.
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
G=$ROOT/gpu-libs

# the CUDA libraries of the machine's PyTorch (cuBLAS, cuDNN), then ours
NV=$(python3 -c "import nvidia, os, glob; print(':'.join(glob.glob(os.path.join(os.path.dirname(nvidia.__file__), '*', 'lib'))))" 2>/dev/null)
export LD_LIBRARY_PATH="$G/lib${NV:+:$NV}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LUA_PATH="$ROOT/lua/?.lua;$ROOT/lua/?/init.lua;$G/share/lua/5.4/?.lua;$G/share/lua/5.4/?/init.lua;;"
export LUA_CPATH="$ROOT/build/?.so;$G/lib/lua/5.4/?.so;;"
export MP_TEST_BUILD=$ROOT/build
LUA=$G/bin/lua5.4

step() {   # step NAME SECONDS COMMAND...: output to $OUT/NAME.txt, a one-line verdict on stdout
  name=$1 secs=$2
  shift 2
  timeout "$secs" "$@" >"$OUT/$name.txt" 2>&1
  rc=$?
  printf '%-22s rc=%-3s %s\n' "$name" "$rc" "$(tail -n 1 "$OUT/$name.txt")" | tee -a "$OUT/summary.txt"
}

: >"$OUT/summary.txt"
step nvidia-smi 20 nvidia-smi
step cuda-available 30 build/mpengine -e 'print("cuda available:", mp.cuda.is_available())'
step parity 240 build/tests/parity
for t in build/tests/test_*; do step "$(basename "$t")" 120 "$t" --short-filename; done
step lua-cpu 300 "$LUA" "$G/bin/busted" --no-auto-insulate tests/lua
step lua-cuda 300 env MP_DEVICE=cuda "$LUA" "$G/bin/busted" --no-auto-insulate tests/lua
step bench-mlp-cpu 120 build/mpengine scripts/bench/bench_mlp.lua
step bench-mlp-cuda 120 env MP_DEVICE=cuda build/mpengine scripts/bench/bench_mlp.lua
echo "results in $OUT"
