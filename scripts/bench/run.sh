#!/bin/sh
# make bench: every benchmark in one run. Figures, not tests: nothing here fails on speed.
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../.." || exit 1
echo "== mpengine $(git describe --always --dirty 2>/dev/null)  $(nproc) cores  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for b in "$BUILD"/bench/bench_*; do
  [ -x "$b" ] && "$b"
done
# conversion again on 64K elements, which stay in cache: the kernels' own speed,
# where the 16M run above is bounded by memory bandwidth on the F16C path
[ -x "$BUILD/bench/bench_convert" ] && "$BUILD/bench/bench_convert" 65536 | sed 's/^convert/convert (in cache)/'
for s in scripts/bench/*.lua; do
  [ -f "$s" ] && "$BUILD/mpengine" "$s"
done
exit 0
