#!/bin/bash
# Wall time of FedH2L's Table II grid, fused vs sequential nodes (engine.fused_clients on / off), the whole
# grid through Snakemake on all cores (--cores N, one torch thread per job as the grid sets), the two paths
# alternating in one sitting on one machine.
#
#     bash benchmarks/fedh2l_grid_time.sh [quick|full] [repeats] [cores]
#
# quick: params/papers/fedh2l_table2_quick.yaml's schedule (500 rounds, seed 0): 10 runs, ~4-5 min per
# path on 2 AVX2 cores. full: the published schedule (10,000 rounds, seeds 0-2): 30 runs, hours per path.
# The runs are FedH2L, AGG and IND at alpha = 5/10/15 % and FedH2L (asynchronous) at 10 %; FedMD is left
# out: it has no fused objective (fused_clients: on refuses it) and would run the same in both paths.
# ROUNDS=<n> in the environment overrides the rounds (a smoke check of this script); SEEDS="[0]" overrides
# the seeds (the published schedule on one seed: both paths fit one sitting of ~2-3 h on 2 cores).
#
# Runs in a scratch worktree of HEAD (results/ of this checkout are never touched); needs `dvc repro`
# first (it copies build/). Prints one line per path and repeat: wall seconds, the runs' summed training
# seconds, and which path each run's log says trained its clients; then each run's training seconds.
set -euo pipefail
schedule=${1:-quick}; repeats=${2:-2}; cores=${3:-2}
case $schedule in
  quick) seeds="[0]"; overlays="params/papers/fedh2l_table2_quick.yaml" ;;
  full) seeds="[0, 1, 2]"; overlays="" ;;
  *) echo "fedh2l_grid_time.sh: schedule must be quick or full, not '$schedule'" >&2; exit 2 ;;
esac
seeds=${SEEDS:-$seeds}
[[ $seeds =~ ^\[[0-9]+(,\ ?[0-9]+)*\]$ ]] || { echo "fedh2l_grid_time.sh: SEEDS must be a list like [0] or [0, 1, 2], not '$seeds'" >&2; exit 2; }
repo=$(git rev-parse --show-toplevel)
[ -d "$repo/build/partitions/rotmnist_a10" ] || { echo "fedh2l_grid_time.sh: $repo/build/partitions/rotmnist_a10 missing: run dvc repro first" >&2; exit 2; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/fedh2l_grid_time.XXXXXX")
trap 'git -C "$repo" worktree remove --force "$scratch/tree" 2>/dev/null || true; rm -rf "$scratch"' EXIT
git -C "$repo" worktree add -q --detach "$scratch/tree" HEAD
cp -r "$repo/build" "$scratch/tree/build"
cd "$scratch/tree"
for p in off on; do
  {
    echo "overlay_of: params/papers/fedh2l_table2.yaml"
    echo "engine:"
    echo "  fused_clients: \"$p\""
    [ -n "${ROUNDS:-}" ] && echo "  rounds: $ROUNDS"
    echo "grid:"
    echo "  - {name: table2, scenarios: [rotmnist_a05, rotmnist_a10, rotmnist_a15], methods: [fedh2l, agg, ind], structures: [homo_lenet], seeds: $seeds}"
    echo "  - {name: table2_async, scenarios: [rotmnist_a10], methods: [fedh2l_async], structures: [homo_lenet], seeds: $seeds}"
    echo "report: {name: fused_timing_$p}"
  } > "$scratch/fused_$p.yaml"
done
export MLFLOW_DISABLE_TELEMETRY=true
echo "$(date -u +%FT%TZ) $schedule schedule, seeds $seeds${ROUNDS:+, $ROUNDS rounds}, $repeats repeats, --cores $cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(grep -c -w avx512f /proc/cpuinfo) cores with AVX-512, commit $(git rev-parse --short HEAD)"
for rep in $(seq 1 "$repeats"); do
  for p in off on; do
    rm -rf results logs mlflow.db mlruns .snakemake/metadata
    start=$(date +%s.%N)
    rc=0; snakemake --nolock --cores "$cores" --configfile params/papers/fedh2l_table2.yaml $overlays "$scratch/fused_$p.yaml" \
      > "$scratch/snakemake_$p$rep.log" 2>&1 || rc=$?
    end=$(date +%s.%N)
    [ $rc -eq 0 ] || { tail -20 "$scratch/snakemake_$p$rep.log" >&2; exit $rc; }
    paths=$(grep -ho "clients train [a-z]* ([^)]*)" logs/federate/*/*/*/*/*.log | sort | uniq -c | xargs)
    # one read of the runs' metrics.json: first line "<runs> <summed train_s>", then one line per run
    per_run=$(python -c "import json,glob
fs = sorted(glob.glob('results/federate/*/none/*/homo_lenet/seed*/metrics.json'))
ts = [json.load(open(f))['timings']['train_s'] for f in fs]
print(len(fs), format(sum(ts), '.1f'))
for f, t in zip(fs, ts): print('  ' + f.split('/', 2)[2].rsplit('/', 1)[0] + ': train_s ' + format(t, '.1f'))")
    read -r runs train <<< "${per_run%%$'\n'*}"
    echo "repeat $rep fused_clients=$p: wall $(python -c "print(f'{$end - $start:.1f}')") s, $runs runs, summed train $train s; $paths"
    echo "${per_run#*$'\n'}"
  done
done
