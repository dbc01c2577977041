#!/bin/sh
# make bench-gpu: mpengine against PyTorch on the same GPU, in one run, as a table
# (row, mpengine, PyTorch, ratio, target). Figures, not tests: a missed target is
# reported, not failed; the exit status is 1 only when an mpengine part crashed.
#
#   a. f16/bf16 matmul TFLOP/s, n = 4096 and 8192       bench_gpu.lua matmul   (target >= 0.9x PyTorch)
#   b. the loss scaler's unscale + inf/NaN check and the  build/bench/gpu_kernels (target >= 0.8x a device
#      fused AdamW step, GB/s                                                      copy in the same run)
#   c. the Fashion-MNIST MLP, batch 1024, f16 AMP with    bench_gpu.lua mlp      (target >= 1.2x PyTorch
#      the dynamic loss scaler: samples/s, peak memory                           eager + fused Adam)
#   d. GPT-2 small (12 L, d 768, T 1024, vocab 50304),    bench_gpu.lua gpt      (targets >= 1.3x PyTorch
#      batch 32, f16 AMP, dynamic scaler, AdamW:                                 eager, >= 1.0x torch.compile,
#      tokens/s, MFU, peak memory                                                memory no higher)
#   e. the CNN of train_cnn.lua, batch 4096, f16 AMP,     bench_gpu.lua cnn      (target >= 1.0x PyTorch
#      dynamic scaler, Adam: samples/s, peak memory                               eager autocast + GradScaler)
#   f. attention forward + backward, f16 and bf16, GPT-2  bench_gpu.lua attention (target >= 0.8x PyTorch's
#      small's shape (B 8, 12 heads, T 1024, d 64), causal                         scaled_dot_product_attention)
#   d'. the GPT-2 step of d. captured with mp.cuda.graph and replayed (target >= 1.0x PyTorch eager)
# First, on any machine: step_model.lua's model of the GPT-2-small step (every
# kernel's FLOPs and bytes, its time at 50% of the H200's ceiling, the target step).
# The PyTorch side is bench_gpu_torch.py, run with python3 (PYTHON=... to choose
# another; PYTHON_LD_LIBRARY_PATH, when set, is its LD_LIBRARY_PATH: gpu_check.sh
# keeps the machine's own libraries for it). Without PyTorch with CUDA, the
# mpengine rows alone. Without a GPU: one "skipped" line, exit 0.
# MP_BENCH_SMOKE=1: everything on the CPU with tiny sizes, to check that the
# scripts run end to end (the figures mean nothing).
# MP_BENCH_GPT=0: without the GPT rows (d); MP_BENCH_GPT=only: the GPT rows alone
# (gpu_check.sh runs them as a step of their own, after the others, at a batch and
# step count that fit its budget: MP_BENCH_GPT_BATCH, MP_BENCH_GPT_STEPS);
# MP_BENCH_GPT_COMPILED=0: without torch.compile's row (its compile takes minutes).
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../../.." || exit 1
HERE=scripts/bench/gpu
MP=$BUILD/mpengine
PY=${PYTHON:-python3}
SMOKE=${MP_BENCH_SMOKE:-}
[ "$SMOKE" = 0 ] && SMOKE=
export MP_BENCH_SMOKE="$SMOKE"
GPT=${MP_BENCH_GPT:-1}

if [ ! -x "$MP" ]; then
  echo "bench-gpu: $MP is missing (make)"
  exit 1
fi
# the model of the GPT-2-small step (FLOPs, bytes, the H200's ceilings, the target
# step time), on any machine, at the GPT rows' batch
if [ "$GPT" != 0 ]; then
  "$MP" "$HERE/step_model.lua" "${MP_BENCH_GPT_BATCH:-32}" || echo "!! step_model.lua failed"
  echo
fi
if [ -z "$SMOKE" ] && [ "$("$MP" -e 'io.write(tostring(mp.cuda.is_available()))' 2>/dev/null)" != true ]; then
  if [ -e /dev/nvidiactl ] || [ -e /proc/driver/nvidia/version ]; then
    echo "bench-gpu: skipped: an NVIDIA driver is present but mpengine's CUDA backend did not load" \
         "($BUILD/mp/cuda.so missing, or its libraries (cuBLAS) not on LD_LIBRARY_PATH)"
  else
    echo "bench-gpu: skipped: no GPU (no NVIDIA driver on $(uname -n): mp.cuda.is_available() is false)"
  fi
  exit 0
fi

T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
tmo() { if command -v timeout >/dev/null 2>&1; then timeout -k 5 "$@"; else shift; "$@"; fi; }
crashed=0
part() {   # part FILE SECONDS COMMAND...: its output to $T/FILE, shown as it is
  f=$1
  shift
  tmo "$@" >"$T/$f" 2>&1
  rc=$?
  cat "$T/$f"
  if [ "$rc" != 0 ]; then
    echo "!! $f: exited $rc$( [ "$rc" = 124 ] && echo " (timed out after $1 s)")"
    crashed=1
  fi
}

echo "== bench-gpu $(git describe --always --dirty 2>/dev/null)  $( (nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi") | head -n 1)${SMOKE:+  (MP_BENCH_SMOKE: on the CPU, tiny sizes: not a measurement)}"
echo "-- mpengine"
if [ "$GPT" != only ]; then
  part mp_mlp.txt 90 "$MP" "$HERE/bench_gpu.lua" mlp
  part mp_matmul.txt 90 "$MP" "$HERE/bench_gpu.lua" matmul
  part mp_cnn.txt 90 "$MP" "$HERE/bench_gpu.lua" cnn
  part mp_attention.txt 90 "$MP" "$HERE/bench_gpu.lua" attention
  if [ -x "$BUILD/bench/gpu_kernels" ]; then
    part mp_kernels.txt 90 "$BUILD/bench/gpu_kernels"
  else
    echo "!! $BUILD/bench/gpu_kernels is missing (make $BUILD/bench/gpu_kernels): the kernel rows are left out"
    crashed=1
  fi
fi
[ "$GPT" != 0 ] && part mp_gpt.txt 240 "$MP" "$HERE/bench_gpu.lua" gpt

echo "-- PyTorch"
: >"$T/torch.txt"
if why=$(env LD_LIBRARY_PATH="${PYTHON_LD_LIBRARY_PATH-${LD_LIBRARY_PATH-}}" "$PY" -c '
import os, sys
try:
    import torch
except Exception as e:
    sys.exit("PyTorch not importable with %s (%s)" % (sys.executable, e))
if not torch.cuda.is_available() and os.environ.get("MP_BENCH_SMOKE", "") == "":
    sys.exit("PyTorch %s has no CUDA device (torch.cuda.is_available() is false)" % torch.__version__)
' 2>&1); then
  if [ "$GPT" != only ]; then
    tmo 180 env LD_LIBRARY_PATH="${PYTHON_LD_LIBRARY_PATH-${LD_LIBRARY_PATH-}}" "$PY" "$HERE/bench_gpu_torch.py" mlp matmul kernels cnn attention >"$T/torch.txt" 2>&1
    rc=$?
    cat "$T/torch.txt"
    [ "$rc" = 0 ] || echo "!! bench_gpu_torch.py exited $rc"
  fi
  # the GPT, eager then compiled, each in a process of its own (its own peak memory)
  gpts="gpt gpt_compiled"
  [ "${MP_BENCH_GPT_COMPILED:-1}" = 0 ] && gpts=gpt
  [ "$GPT" = 0 ] || for g in $gpts; do
    tmo 300 env LD_LIBRARY_PATH="${PYTHON_LD_LIBRARY_PATH-${LD_LIBRARY_PATH-}}" "$PY" "$HERE/bench_gpu_torch.py" $g >"$T/torch_$g.txt" 2>&1
    rc=$?
    cat "$T/torch_$g.txt"
    cat "$T/torch_$g.txt" >>"$T/torch.txt"
    [ "$rc" = 0 ] || echo "!! bench_gpu_torch.py $g exited $rc"
  done
else
  echo "PyTorch rows skipped: $(echo "$why" | tail -n 1)"
fi

# ---- the table ----
echo
echo "== bench-gpu table${SMOKE:+ (MP_BENCH_SMOKE: CPU, tiny sizes: not a measurement)}"
cat "$T/mp_matmul.txt" "$T/mp_kernels.txt" "$T/mp_mlp.txt" "$T/mp_cnn.txt" "$T/mp_attention.txt" "$T/mp_gpt.txt" 2>/dev/null | grep '^ROW ' | sed 's/^ROW /M /' >"$T/rows"
grep '^ROW ' "$T/torch.txt" | sed 's/^ROW /P /' >>"$T/rows"
awk '
  { v[$1, $2] = $3; u[$2] = $4; if (!($2 in seen)) { seen[$2] = 1; keys[++nk] = $2 } }
  function num(x) { return x == "" ? "-" : sprintf(x >= 100 ? "%.0f" : x >= 1 ? "%.1f" : "%.3g", x) }
  function line(label, a, b, ratio, target) {
    printf "%-44s %12s %12s %8s  %s\n", label, a, b, ratio, target
  }
  function verdict(r, t) { return r == "" ? "" : (r >= t ? "met" : "MISSED") }
  BEGIN { line("row", "mpengine", "PyTorch", "ratio", "target") }
  END {
    for (i = 1; i <= nk; i++) {
      k = keys[i]; a = v["M", k]; b = v["P", k]
      r = (a != "" && b != "" && b > 0) ? a / b : ""
      rs = r == "" ? "-" : sprintf("%.2fx", r)
      if (k ~ /^matmul_/) {
        split(k, p, "_")
        line(sprintf("matmul %s n=%s (%s)", p[2], p[3], u[k]), num(a), num(b), rs, ">= 0.9x " verdict(r, 0.9))
      } else if (k == "mlp_samples_per_s") {
        line("MLP step, f16 AMP, dynamic scaler (samples/s)", num(a), num(b), rs, ">= 1.2x " verdict(r, 1.2))
      } else if (k == "mlp_peak_mem") {
        line("MLP peak GPU memory (MiB)", num(a), num(b), rs, "info (< 1x: mpengine uses less)")
      } else if (k == "cnn_samples_per_s") {
        line("CNN step, f16 AMP, dynamic scaler (samples/s)", num(a), num(b), rs, ">= 1.0x " verdict(r, 1.0))
      } else if (k == "cnn_peak_mem") {
        line("CNN peak GPU memory (MiB)", num(a), num(b), rs, "info (< 1x: mpengine uses less)")
      } else if (k ~ /^attention_/) {
        split(k, p, "_")
        line(sprintf("attention %s fwd+bwd, causal (TFLOP/s)", p[2]), num(a), num(b), rs, ">= 0.8x " verdict(r, 0.8))
      } else if (k == "gpt_graph_tokens_per_s") {
        c = v["P", "gpt_tokens_per_s"]; rc = (a != "" && c != "" && c > 0) ? a / c : ""
        line("GPT-2 small as a CUDA graph (tokens/s) vs eager", num(a), num(c), rc == "" ? "-" : sprintf("%.2fx", rc), ">= 1.0x " verdict(rc, 1.0))
      } else if (k == "gpt_tokens_per_s") {
        line("GPT-2 small f16 AMP (tokens/s) vs eager", num(a), num(b), rs, ">= 1.3x " verdict(r, 1.3))
        c = v["P", "gpt_compiled_tokens_per_s"]; rc = (a != "" && c != "" && c > 0) ? a / c : ""
        line("  vs torch.compile (tokens/s)", num(a), num(c), rc == "" ? "-" : sprintf("%.2fx", rc), ">= 1.0x " verdict(rc, 1.0))
      } else if (k == "gpt_mfu") {
        c = v["P", "gpt_compiled_mfu"]
        line("GPT-2 small MFU (%, of 989 TFLOP/s) eager/compiled", num(a), num(b) "/" num(c), rs, "info")
      } else if (k == "gpt_peak_mem") {
        c = v["P", "gpt_compiled_peak_mem"]; rc = (a != "" && c != "" && c > 0) ? a / c : ""
        line("GPT-2 small peak GPU memory (MiB) vs eager", num(a), num(b), rs, "<= 1.0x " (r == "" ? "" : (r <= 1.0 ? "met" : "MISSED")))
        line("  vs torch.compile (MiB)", num(a), num(c), rc == "" ? "-" : sprintf("%.2fx", rc), "<= 1.0x " (rc == "" ? "" : (rc <= 1.0 ? "met" : "MISSED")))
      } else if (k ~ /^gpt_compiled_/) {
        ;   # shown beside the eager rows
      } else if (k ~ /_gbs$/) {
        name = k; sub(/_gbs$/, "", name)
        label = name == "copy" ? "device copy (GB/s, read + write)" : name == "unscale" ? "unscale + inf/NaN check (GB/s)" : \
                name == "unscale_tel" ? "unscale + telemetry (GB/s)" : name == "adamw" ? "fused AdamW step (GB/s)" : \
                name == "adamw_lowp" ? "fused AdamW + f16 working copy (GB/s)" : name " (GB/s)"
        line(label, num(a), num(b), rs, name == "copy" ? "(the reference below)" : "info")
        ca = v["M", "copy_gbs"]; cb = v["P", "copy_gbs"]
        if (name != "copy" && ca != "") {
          ra = a != "" ? a / ca : ""; rb = (b != "" && cb != "") ? sprintf("%.2fx", b / cb) : "-"
          tgt = (name == "unscale" || name == "adamw") ? ">= 0.8x " verdict(ra, 0.8) : "info"
          line("  " name " / device copy, same run", ra == "" ? "-" : sprintf("%.2fx", ra), rb, "", tgt)
        }
      } else {
        line(k " (" u[k] ")", num(a), num(b), rs, "")
      }
    }
  }' "$T/rows"
if ! grep -q '^ROW ' "$T/torch.txt"; then echo "(PyTorch rows skipped: see above)"; fi
exit "$crashed"
