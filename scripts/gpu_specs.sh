#!/bin/sh
# gpu_specs.sh SECONDS: gpu_check.sh's lua-cuda step. The Lua specs with
# MP_DEVICE=cuda, one busted run per spec file (TAP), in the order below: the
# files that exercise the device most first, then the rest by name. The whole
# suite takes longer on a GPU than one lease allows (on the H200, 258 tests in
# 120 s; the emulated device needs 7-8 minutes), so the step runs the files
# that fit in SECONDS and names the ones it did not reach. Each file's line:
#   # spec FILE: rc R, S s
# and the last line:
#   # lua-cuda: N of M spec files run, C cut off by the time limit, K not reached
# Exit status: 1 when a file that ran failed (or crashed), else 0. A file cut
# off by the limit is reported, not failed (its tests up to the cut are in the
# TAP lines). Needs LUA (lua5.4) and busted on PATH, as gpu_check.sh sets them.
cd "$(dirname "$0")/.." || exit 1
ALLOT=${1:?gpu_specs.sh: SECONDS expected}
# the specs that only start CPU child processes are CI's
SKIP="amp_scripts_spec train_spec cli_spec repl_spec thread_bits_spec"
FIRST="device_spec cuda_graph_spec attention_spec amp_spec amp_recipes_spec amp_wide_spec conv_spec
  batch_norm_act_spec cross_entropy_lowp_spec gpt_spec gpt_qkv_spec gpt_reference_spec cnn_reference_spec
  fp8_spec fp8_matmul_spec fp8_linear_spec fp8_recipes_spec fp8_trace_spec dist_spec optim_spec scaler_spec"
files=""
for f in $FIRST; do [ -f "tests/lua/$f.lua" ] && files="$files tests/lua/$f.lua"; done
for f in tests/lua/*_spec.lua; do
  b=$(basename "$f" .lua)
  case " $SKIP " in *" $b "*) continue ;; esac
  case " $files " in *" $f "*) continue ;; esac
  files="$files $f"
done
start=$(date +%s)
total=0 run=0 cut=0 missed=0 failed=0 notrun=""
for f in $files; do
  total=$((total + 1))
  left=$((ALLOT - ($(date +%s) - start)))
  if [ "$left" -lt 5 ]; then
    missed=$((missed + 1)) notrun="$notrun $(basename "$f" .lua)"
    continue
  fi
  t0=$(date +%s)
  timeout -k 5 "$left" env MP_DEVICE=cuda "$LUA" "$(command -v busted)" -o TAP -v --no-auto-insulate "$f" 2>&1
  rc=$?
  echo "# spec $f: rc $rc, $(($(date +%s) - t0)) s"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    cut=$((cut + 1)) notrun="$notrun $(basename "$f" .lua)(cut)"
  else
    run=$((run + 1))
    [ "$rc" = 0 ] || failed=1
  fi
done
[ -n "$notrun" ] && echo "# not run in ${ALLOT} s:$notrun"
echo "# lua-cuda: $run of $total spec files run, $cut cut off by the time limit, $missed not reached"
exit "$failed"
