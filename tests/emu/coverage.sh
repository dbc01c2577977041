#!/bin/sh
# coverage.sh FILE: which of the CUDA backend's kernels and launch sites the
# emulated device ran, of all that kernels/cuda holds. FILE has the lines that
# MP_EMU_COVERAGE appended at each process's exit: "kernels/cuda/F.cu:LINE
# KERNEL COUNT". A launch site is a line that launches (MP_LAUNCH, or a macro
# of the file whose body launches); a kernel, a __global__ function (a
# template counts once). Prints one summary line and what did not run.
cov=$1
cd "$(dirname "$0")/../.." || exit 1
[ -s "$cov" ] || { echo "== emulated device coverage: nothing recorded"; exit 0; }
tmp=$(mktemp) && trap 'rm -f "$tmp"' EXIT
for f in kernels/cuda/*.cu; do
  awk -v f="$f" '
    /^#define [A-Z_]+\(/ { def = 1; name = $2; sub(/\(.*/, "", name) }
    def && /MP_LAUNCH/ { macro[name] = 1 }
    def { if (!/\\$/) def = 0; next }
    /MP_LAUNCH(_UNORDERED)?\(/ { print "site " f ":" NR; next }
    { for (m in macro) if ($0 ~ ("(^|[^A-Za-z0-9_])" m "\\(")) { print "site " f ":" NR; break } }
    /__global__ void (__launch_bounds__\([^)]*\) )?[a-z_0-9]+\(/ {
      k = $0; sub(/.*__global__ void /, "", k); sub(/^__launch_bounds__\([^)]*\) /, "", k); sub(/\(.*/, "", k); print "kernel " k }
  ' "$f"
done >"$tmp"
awk -v tmp="$tmp" '
  BEGIN {
    while ((getline l < tmp) > 0) {
      split(l, p, " ")
      if (p[1] == "site") { site[p[2]] = 0; ns++ }
      else { kernel[p[2]] = 0; nk++ }
    }
  }
  { s = $1; k = $2; sub(/<.*/, "", k); if (s in site) site[s] += $NF; if (k in kernel) kernel[k] += $NF }
  END {
    for (s in site) if (site[s] > 0) rs++; else miss = miss " " s
    for (k in kernel) if (kernel[k] > 0) rk++; else missk = missk " " k
    printf "== emulated device coverage: %d of %d launch sites and %d of %d kernels ran\n", rs, ns, rk, nk
    if (miss != "") print "   launch sites not run:" miss
    if (missk != "") print "   kernels not run:" missk
  }' "$cov"
