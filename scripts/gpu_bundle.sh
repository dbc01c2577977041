#!/bin/sh
# gpu_bundle.sh: gather into gpu-libs/ (git-ignored) what scripts/gpu_check.sh runs
# on the GPU machine, which has no Debian packages (docs/ARCHITECTURE.md, "The GPU
# check"), and nothing more:
#   gpu-libs/build/     the binaries of the GPU steps, without debug info: mpengine,
#                       mp/core.so, mp/cuda.so (sm_90 machine code and one PTX),
#                       tests/parity, bench/gpu_kernels, and the two test backends
#                       device_spec loads (tests/fake_cuda.so, tests/missing_dep.so);
#                       the C tests are CI's: their one device case is parity's and
#                       cuda-load's too, and Criterion's libraries would double the
#                       bundle
#   gpu-libs/lib/       the shared libraries those link that such a machine lacks:
#                       not glibc; not CUDA's (the driver, cuBLAS, cuDNN, NCCL: the
#                       machine's PyTorch brings the ones that match its driver: a
#                       cuDNN loader from here would load its own sub-libraries'
#                       versions there); not Open MPI's (mp.dist runs a world of one
#                       there, and mpi.so is not carried)
#   gpu-libs/fallback/  libstdc++ and libgcc_s, used only where the machine has none
#   gpu-libs/bin, share, lua: lua5.4 and busted with its Lua modules
# Every file over 256 KiB travels xz-compressed (NAME.xz); gpu_check.sh unpacks the
# bundle into a temporary folder. Carry to the GPU machine (the device tool's
# `carry`): gpu-libs. The work tree travels too (the Lua library, the specs, the
# scripts): this script measures both together and exits 1 above 30 MiB.
set -e
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
G=gpu-libs
LIMIT=$((30 * 1024 * 1024))
BINS="mpengine mp/core.so mp/cuda.so tests/parity bench/gpu_kernels tests/fake_cuda.so tests/missing_dep.so"

for b in $BINS; do
  [ -f "$BUILD/$b" ] || { echo "gpu_bundle: $BUILD/$b is missing (make gpu-bundle builds it; mp/cuda.so needs nvcc)" >&2; exit 1; }
done
rm -rf "$G"
mkdir -p "$G/build/mp" "$G/build/tests" "$G/build/bench" "$G/lib" "$G/fallback" "$G/bin" "$G/share/lua/5.4" \
         "$G/lib/lua/5.4"
for b in $BINS; do
  cp "$BUILD/$b" "$G/build/$b"
  strip --strip-debug "$G/build/$b"
done
for bin in $(for b in $BINS; do echo "$BUILD/$b"; done) /usr/bin/lua5.4 \
           /usr/lib/x86_64-linux-gnu/lua/5.4/*.so /usr/lib/x86_64-linux-gnu/lua/5.4/*/*.so; do
  [ -f "$bin" ] || continue
  ldd "$bin" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    # the machine's own glibc
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libresolv.so.*|libutil.so.*|libnsl.so.*|libanl.so.*) ;;
    # the machine's CUDA: driver, runtime and libraries (its PyTorch's)
    libcuda.so.*|libcublas*|libcudart*|libcudnn*|libnccl*|libnvidia*|libnvrtc*|libnvJitLink*) ;;
    # Open MPI and what it brings (never loaded there)
    libmpi*|libopen-*|libpmix*|libhwloc*|libevent*|libprrte*) ;;
    # the C++ runtime: every machine with PyTorch has one; ours only where it has none
    libstdc++.so.*|libgcc_s.so.*) cp -L "$lib" "$G/fallback/" ;;
    *) cp -L "$lib" "$G/lib/" ;;
  esac
done
cp -L /usr/bin/lua5.4 "$G/bin/lua5.4"
cp -rL /usr/share/lua/5.4/. "$G/share/lua/5.4/"
cp -rL /usr/lib/x86_64-linux-gnu/lua/5.4/. "$G/lib/lua/5.4/"
# busted's launcher, run with our lua5.4 (gpu_check.sh puts $G/bin first on PATH,
# and the Lua tests start `lua5.4` children: LUA points at ours too)
printf '%s\n' '#!/usr/bin/env lua5.4' 'require "busted.runner"({standalone = false})' >"$G/bin/busted"
chmod +x "$G/bin/busted" "$G/bin/lua5.4"
# everything large travels compressed
find "$G" -type f -size +256k | while read -r f; do xz -T0 -9 "$f"; done

tree=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
carried=$(du -cb "$G" | tail -n 1 | cut -f1)
total=$((tree + carried))
echo "gpu_bundle: $G: $((carried / 1024)) KiB; the work tree: $((tree / 1024)) KiB; carried in all: $((total / 1024)) KiB" \
     "of the $((LIMIT / 1024)) KiB this project allows (the device tool takes 64 MiB); carry: $G"
if [ "$total" -gt "$LIMIT" ]; then
  echo "gpu_bundle: over $((LIMIT / 1024 / 1024)) MiB" >&2
  exit 1
fi
