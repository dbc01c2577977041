#!/bin/sh
# tests/fuzz/run.sh TARGET...: each libFuzzer target for $FUZZ_S seconds (default
# 60), from a copy of its committed corpus (tests/fuzz/corpus/TARGET; what the
# fuzzer adds stays in $BUILD/corpus). A crash, sanitizer report, leak or
# timeout is saved as $BUILD/crashes/TARGET-* and fails the run. Prints one line
# per target: executions, corpus size, findings.
BUILD=${BUILD:-build-fuzz}
FUZZ_S=${FUZZ_S:-60}
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$BUILD/crashes" "$BUILD/logs"
failed=0
for t in "$@"; do
  bin="$BUILD/fuzz/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz $t: $bin missing"; failed=1; continue; }
  corpus="$BUILD/corpus/$t"
  mkdir -p "$corpus"
  cp -n tests/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null
  log="$BUILD/logs/$t.log"
  before=$(ls "$BUILD/crashes" | grep -c "^$t-")
  # mp.data.text reads at most max_bytes, whatever the file, and a trace's lines
  # are capped and its records held packed: those targets are held to 512 MB
  rss=3072
  case "$t" in text|trace) rss=512 ;; esac
  "$bin" -max_total_time="$FUZZ_S" -timeout=20 -rss_limit_mb="$rss" -print_final_stats=1 \
    -artifact_prefix="$BUILD/crashes/$t-" "$corpus" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  after=$(ls "$BUILD/crashes" | grep -c "^$t-")
  found=$((after - before))
  size=$(ls "$corpus" | wc -l)
  if [ "$rc" -ne 0 ] || [ "$found" -gt 0 ]; then
    failed=1
    echo "fuzz $t: FAILED after ${execs:-?} executions (exit $rc); saved: $(ls "$BUILD/crashes" | grep "^$t-" | tr '\n' ' ')"
    grep -m 3 -E "ERROR|runtime error|SUMMARY" "$log"
  else
    echo "fuzz $t: ${execs:-?} executions in ${FUZZ_S} s, corpus $size inputs, 0 crashes"
  fi
done
exit $failed
