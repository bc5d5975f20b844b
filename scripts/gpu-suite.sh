#!/usr/bin/env bash
# The benchmark suite (WORKLOADS.md) on the device machine, measured the way a user meets it: `comfuse bench`
# (the planner's choice of kernel, config and transport, or cuBLAS / the plain path where it declines) ÷ the
# cuBLASLt GEMM that the same call times, for every epilogue × shape, two rounds. Optionally torch.compile's
# alternatives (bench/torch_compile_ref.py) in the same run. Logs and a CSV under $OUT; a table printed last.
#
#   scripts/gpu-suite.sh [--cli PATH] [--epilogues "gemm bias_gelu postnorm rmsnorm softmax ln_softmax"]
#                        [--shapes "M,K,N M,K,N"] [--iters N] [--torch] [--jobs J] [--merge-ab]
#     --cli     the comfuse binary (default build/bin/comfuse: built here, carried; it runs there)
#     --merge-ab  postnorm, softmax and ln_softmax each twice, with --merge on and --merge off (the same tile
#               config, the reduction pairs merged into one exchange or chained), interleaved in every round
#     --torch   also run bench/torch_compile_ref.py on the same shapes and epilogues (default and max-autotune)
# Needs the CUTLASS headers at .carry/cutlass/include (scripts/gpu-check.sh --prepare) for the JIT.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cli="build/bin/comfuse"
epilogues="gemm bias_gelu postnorm rmsnorm softmax ln_softmax"
shapes="16384,1024,1024 16384,4096,1024 8192,4096,4096 8192,16384,4096 4096,4096,8192 8192,768,768 8192,3072,768 8192,768,3072"
iters=30 torch=0 jobs=16 merge_ab=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cli) cli="$2"; shift ;;
    --epilogues) epilogues="$2"; shift ;;
    --shapes) shapes="$2"; shift ;;
    --iters) iters="$2"; shift ;;
    --torch) torch=1 ;;
    --jobs) jobs="$2"; shift ;;
    --merge-ab) merge_ab=1 ;;
    *) echo "gpu-suite: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT="${OUT:-$root/build/gpu-suite}"
mkdir -p "$OUT/cf" "$OUT/logs"
source scripts/gpu-lib.sh
COMFUSE_CUTLASS_DIR="$(gpu_cutlass_dir gpu-suite)" || exit 1
export COMFUSE_KERNEL_DIR="$root/kernels" COMFUSE_CUTLASS_DIR
export COMFUSE_CACHE_DIR="${COMFUSE_CACHE_DIR:-$OUT/cache}"
[ -x "$cli" ] || { echo "gpu-suite: no CLI at $cli" >&2; exit 1; }

# One .cf per (epilogue, shape): the examples' graphs (examples/*.cf) at M, K, N.
write_cf() {   # epilogue M K N file
  local e="$1" M="$2" K="$3" N="$4" f="$5"
  {
    echo "input X : bf16[$M, $K]"
    echo "input W : bf16[$K, $N]"
    [ "$e" != gemm ] && echo "input b : bf16[$N]"
    case "$e" in postnorm|rmsnorm|ln_softmax) echo "input R : bf16[$M, $N]"; echo "input gamma : bf16[$N]" ;; esac
    case "$e" in postnorm|ln_softmax) echo "input beta : bf16[$N]" ;; esac
    case "$e" in
      gemm) echo "y = matmul(X, W)" ;;
      bias_gelu) echo 'y = gelu(add(matmul(X, W), b), approximate="tanh")' ;;
      postnorm) echo "y = layer_norm(add(add(matmul(X, W), b), R), gamma, beta, eps=1e-5)" ;;
      rmsnorm) echo "y = rms_norm(add(add(matmul(X, W), b), R), gamma, eps=1e-6)" ;;
      softmax) echo "y = softmax(add(matmul(X, W), b), dim=-1)" ;;
      ln_softmax) echo "h = layer_norm(add(add(matmul(X, W), b), R), gamma, beta, eps=1e-5)"; echo "y = softmax(h, dim=-1)" ;;
      *) echo "gpu-suite: unknown epilogue $e" >&2; return 1 ;;
    esac
    echo "output y"
  } > "$f"
}
cases=()
for e in $epilogues; do
  for s in $shapes; do
    IFS=, read -r M K N <<< "$s"
    name="${e}_${M}x${K}x${N}"
    write_cf "$e" "$M" "$K" "$N" "$OUT/cf/$name.cf" || exit 2
    if [ $merge_ab = 1 ] && { [ "$e" = postnorm ] || [ "$e" = softmax ] || [ "$e" = ln_softmax ]; }; then
      cases+=("$name@on" "$name@off")   # the same graph, --merge on / off
    else
      cases+=("$name")
    fi
  done
done

# Compile every kernel first, in parallel (the JIT cache is shared, so the benches below are cache hits).
t0=$(date +%s)
# a case is NAME or NAME@on / NAME@off (--merge-ab): the graph's .cf is NAME's
merge_flag() { case "$1" in *@on) echo "--merge on" ;; *@off) echo "--merge off" ;; esac; }
# (no trailing blank on a line: xargs -L would join it with the next, and every graph then went to one aot call)
for c in "${cases[@]}"; do f="$(merge_flag "$c")"; echo "$c${f:+ $f}"; done |
  xargs -P "$jobs" -L 1 sh -c 'o="$1"; c="$2"; shift 2; "$0" aot "$o/cf/${c%@*}.cf" -o "$o/aot/$c" "$@" > "$o/logs/$c.aot.log" 2>&1 ||
    echo "aot failed: $c"' "$cli" "$OUT"
t1=$(date +%s)
echo "gpu-suite: compiled ${#cases[@]} graphs in $((t1 - t0)) s"

csv="$OUT/suite.csv"
echo "case,epilogue,M,K,N,round,fused_us,cublas_us,ratio,config,plan" > "$csv"
for round in 1 2; do
  for c in "${cases[@]}"; do
    log="$OUT/logs/$c.bench$round.log"
    # shellcheck disable=SC2046
    timeout 120 "$cli" bench "$OUT/cf/${c%@*}.cf" --iters "$iters" $(merge_flag "$c") > "$log" 2>&1
    fused=$(sed -nE 's/.*: median ([0-9.]+) us over.*/\1/p' "$log" | head -1)
    line=$(grep -E "cuBLASLt GEMM.* alone: " "$log" | head -1)
    cub=$(echo "$line" | sed -nE 's/.* alone: ([0-9.]+) us;.*/\1/p')
    ratio=$(echo "$line" | sed -nE 's/.*= ([0-9.]+)$/\1/p')
    cfg=$(grep -E "^region 0: " "$log" | head -1 | sed -E 's/^region 0: (comfuse_[0-9a-f]+ )?//; s/,.*//; s/ /_/g')
    # the config search's choice for this row count, where it ran (else the prior above)
    chosen=$(grep -E "^config search: region 0, " "$log" | head -1 | sed -E 's/^config search: region 0, M bucket [0-9]+ on [^:]*: //; s/,.*//; s/ /_/g')
    [ -n "$chosen" ] && cfg="$chosen"
    # the planner's decision: where it declines, a user gets the unfused path (cuBLAS + a separate pass)
    grep -qE "^  plan: fuse" "$log" && plan=fuse || plan=declined
    e="${c%%_[0-9]*}"
    dims="${c##*_}"
    dims="${dims%@*}"
    case "$c" in *@on) e="$e (merged)" ;; *@off) e="$e (chained)" ;; esac
    echo "$c,$e,${dims//x/,},$round,${fused:-nan},${cub:-nan},${ratio:-nan},${cfg:-?},$plan" >> "$csv"
  done
done
t2=$(date +%s)
echo "gpu-suite: benched in $((t2 - t1)) s"

# The table: per case, the two rounds' ratios and their median (the mean of two).
python3 - "$csv" <<'EOF'
import csv, sys, collections
rows = collections.OrderedDict()
for r in csv.DictReader(open(sys.argv[1])):
    rows.setdefault(r["case"], []).append(r)
print("| epilogue | M, K, N | round 1 | round 2 | median ÷cuBLASLt | fused µs | cuBLAS µs | config (chosen) | planner |")
print("|---|---|---|---|---|---|---|---|---|")
for case, rs in rows.items():
    def f(x):
        try: return float(x)
        except ValueError: return float("nan")
    ratios = [f(r["ratio"]) for r in rs]
    med = sum(ratios) / len(ratios)
    r0 = rs[-1]
    print(f"| {r0['epilogue']} | {r0['M']}, {r0['K']}, {r0['N']} | " + " | ".join(f"{x:.3f}" for x in ratios) +
          f" | {med:.3f} | {f(r0['fused_us']):.1f} | {f(r0['cublas_us']):.1f} | {r0['config']} | {r0['plan']} |")
EOF

if [ $torch = 1 ]; then
  tshapes=$(echo "$shapes" | tr ' ' ';')
  tepis=$(echo "$epilogues" | tr ' ' '\n' | grep -v '^gemm$' | paste -sd, -)
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/torch_compile_ref.py --shapes "$tshapes" --epilogues "$tepis" \
    --out "$OUT/torch_compile.csv" > "$OUT/torch_compile.log" 2>&1
  echo "gpu-suite: torch_compile_ref rc=$?"
  tail -40 "$OUT/torch_compile.log"
fi
