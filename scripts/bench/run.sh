#!/bin/sh
# make bench: every benchmark in one run. Figures, not tests: nothing here fails on speed.
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../.." || exit 1
echo "== mpengine $(git describe --always --dirty 2>/dev/null)  $(nproc) cores  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for b in "$BUILD"/bench/bench_*; do
  [ -x "$b" ] && "$b"
done
for s in scripts/bench/*.lua; do
  [ -f "$s" ] && "$BUILD/mpengine" "$s"
done
exit 0
