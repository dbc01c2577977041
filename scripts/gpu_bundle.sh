#!/bin/sh
# gpu_bundle.sh: gather, into gpu-libs/ (git-ignored), what the binaries in build/
# need on the GPU machine, which has no Debian packages (../shared/GPU.md): the
# shared libraries they link (not glibc, not the CUDA libraries: those come from
# that machine's PyTorch), the lua5.4 interpreter, and busted with its Lua modules.
# scripts/gpu_check.sh uses it there.
#
# The device tool carries at most 64 MiB, so libraries over 1 MiB travel
# xz-compressed (lib/NAME.xz; OpenBLAS alone is 35 MB, 4 MB compressed) and
# gpu_check.sh unpacks them into a temporary folder. libstdc++ and libgcc_s go to
# fallback/: gpu_check.sh uses them only where the machine has none of its own.
#
# Carry to the GPU machine (the device tool's `carry`):
#   build/mp build/tests build/mpengine build/bench gpu-libs
# This script checks that those stay under 64 MiB, and exits 1 if they do not.
set -e
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
G=gpu-libs
CARRY="$BUILD/mp $BUILD/tests $BUILD/mpengine $BUILD/bench $G"
LIMIT=$((64 * 1024 * 1024))

rm -rf "$G"
mkdir -p "$G/lib" "$G/fallback" "$G/bin" "$G/share/lua/5.4" "$G/lib/lua/5.4"
for bin in "$BUILD/mpengine" "$BUILD"/mp/*.so "$BUILD"/tests/* "$BUILD"/bench/* /usr/bin/lua5.4 \
           /usr/lib/x86_64-linux-gnu/lua/5.4/*.so /usr/lib/x86_64-linux-gnu/lua/5.4/*/*.so; do
  [ -f "$bin" ] || continue
  ldd "$bin" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    # the machine's own glibc
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libresolv.so.*|libutil.so.*|libnsl.so.*|libanl.so.*) ;;
    # the machine's CUDA: driver, and the toolkit libraries of its PyTorch
    libcuda.so.*|libcublas*|libcudart*|libnvidia*|libnvrtc*|libnvJitLink*) ;;
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

# the big libraries travel compressed
find "$G/lib" "$G/fallback" -maxdepth 1 -type f -size +1024k | while read -r f; do
  xz -T0 -6 "$f"
done

du -sh $CARRY 2>/dev/null
total=$(du -cb $CARRY 2>/dev/null | tail -n 1 | cut -f1)
echo "carried in all: $((total / 1024 / 1024)) MiB of 64 MiB ($total bytes); carry: $CARRY"
if [ "$total" -gt "$LIMIT" ]; then
  echo "gpu_bundle: the carried paths are over 64 MiB: the device tool will not take them" >&2
  exit 1
fi
