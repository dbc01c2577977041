#!/bin/sh
# gpu_bundle.sh: gather, into gpu-libs/ (git-ignored), what the binaries in build/
# need on a machine without Debian's packages: the shared libraries they link
# (not glibc itself), the lua5.4 interpreter, and busted with its Lua modules.
# scripts/gpu_check.sh uses it there. Everything carried must stay under 64 MiB.
set -e
cd "$(dirname "$0")/.."
G=gpu-libs
rm -rf "$G"
mkdir -p "$G/lib" "$G/bin" "$G/share/lua/5.4" "$G/lib/lua/5.4"
for bin in build/mpengine build/mp/core.so build/tests/* /usr/bin/lua5.4 \
           /usr/lib/x86_64-linux-gnu/lua/5.4/*.so /usr/lib/x86_64-linux-gnu/lua/5.4/*/*.so; do
  [ -f "$bin" ] || continue
  ldd "$bin" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;   # the machine's own glibc
    libcuda.so.*|libcublas*|libcudart*) ;;                                     # the machine's CUDA
    *) cp -L "$lib" "$G/lib/" ;;
  esac
done
cp -L /usr/bin/lua5.4 "$G/bin/lua5.4"
cp -rL /usr/share/lua/5.4/. "$G/share/lua/5.4/"
cp -rL /usr/lib/x86_64-linux-gnu/lua/5.4/. "$G/lib/lua/5.4/"
# busted's launcher, run with our lua5.4
printf '%s\n' 'require "busted.runner"({standalone = false})' >"$G/bin/busted"
du -sh "$G" build/mp build/tests build/mpengine build/bench 2>/dev/null
