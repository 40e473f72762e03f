#!/usr/bin/env bash
# The GPU checks and benchmarks in one command, on a machine with a CUDA device and no
# network: installs nothing, runs from the source tree (PYTHONPATH=.), needs no DGL.
#
#   tools/gpu_suite.sh RESULTS_DIR [STAGE ...]
#
# Stages (default: all, in this order):
#   tests    pytest -m gpu (kernels vs the torch reference, the full RSC step on CUDA)
#   kernels  tools/bench_kernels.py: each kernel vs its torch reference
#   spmm     tools/bench_spmm.py --device cuda at Reddit and ogbn-products scale
#   solver   tools/experiments/bench_solver.py: the budget solver, 3 layers x 2.4M rows, vs one product
#   e2e      tools/bench_e2e.py: exact vs RSC (vs PyG at Reddit scale) per epoch, time to target
#            and one profiled step of each, at Reddit scale (GCN, SAGE; fp32, bf16) and at
#            ogbn-products scale (GCN, fp32)
#   grid     exact's accuracy on the 200k preset against dataset.homophily ($GRID, seed 0)
#   tta      time to accuracy on the 200k preset at homophily $H (default: the grid's largest
#            with exact's test accuracy at most 0.94): the launcher on the PyG engine (stock
#            PyG, exact, RSC; seeds $TTA_SEEDS), then tools/experiments/tta_sweep.py (native engine:
#            RSC default, cache_interval 1, budget 0.3, budget auto)
#   rem      time to accuracy on the 200k preset (native engine, seeds $TTA_SEEDS, default 0-4):
#            exact, RSC's defaults, tune_interval 10 (the default before 2026-11-26), budget auto
#   now      time to accuracy on the 200k preset (native engine, seeds $TTA_SEEDS, default 0-4):
#            exact, RSC's defaults, budget auto, switch_at 0.9
#   pyg      the launcher as a PyG user runs the 200k preset (engine pyg: stock PyG, exact,
#            RSC; seeds $PYG_SEEDS, default 0 1); its results.json, metrics.csv and table.txt
#            to RESULTS_DIR as pyg_*
#   mean     the 200k preset's mean and median epoch, RSC's defaults and tune_interval 10 against
#            exact, interleaved epoch by epoch (tools/interleaved_epochs.py, 120 rounds)
#   forward  tools/experiments/bench_forward.py: the forward product kernel (cuda/spmm_forward.cu) against
#            cuSPARSE and the gather form, fp32 and bf16; the INT8 kernels (CuPy, Numba-CUDA)
#            bit-compared and timed against cuSPARSE; torch._int_mm against fp32/tf32/bf16 GEMMs
#   precision  the 200k preset's epochs in fp32, bf16 (AMP) and INT8, exact and RSC (the
#            launcher, $PREC_EPOCHS epochs, default 30); results.json to RESULTS_DIR as prec_*
#   fwdab    the 200k preset's time to accuracy and epochs with CUDA products on dgl_rsc's
#            kernel and on cuSPARSE (tools/experiments/tta_sweep.py --cusparse), seeds $TTA_SEEDS (0-2)
#   tta5     time to accuracy on the 200k preset, exact and RSC's defaults, seeds $TTA_SEEDS
#            (default 0-4), native engine
#
# With --dry-run first, nothing runs: each stage's commands are printed and every Python
# tool they name is started with --help (the pytest stage collects the GPU tests instead).
# Full JSON goes to RESULTS_DIR; a short table is printed last.
set -uo pipefail
case ${1:-} in -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
dry=
[ "${1:-}" = --dry-run ] && { dry=1; shift; }
out=${1:?usage: tools/gpu_suite.sh [--dry-run] RESULTS_DIR [STAGE ...]}
shift
stages=${*:-tests kernels spmm solver e2e}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OUTDATED_IGNORE=1
py=${PYTHON:-python3}
status=0
# run a stage's command, or in a dry run print it and start the Python tool it names with --help
run() {
  if [ -z "$dry" ]; then "$@"; return; fi
  echo "+ $*"
  if [ "$1" = "$py" ] && [ "$2" = -m ] && [ "$3" = pytest ]; then
    "$py" -m pytest -m gpu -q --collect-only -p no:cacheprovider tests >/dev/null
  elif [ "$1" = "$py" ] && [ "$2" = -m ]; then "$py" -m "$3" "$4" --help >/dev/null
  elif [ "$1" = "$py" ]; then "$py" "$2" --help >/dev/null
  fi
}
for stage in $stages; do
  echo "=== $stage"
  case $stage in
    tests)   run $py -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee "$out/pytest_gpu.log" | tail -25 ;;
    kernels) run $py tools/bench_kernels.py --out "$out/kernels.json" ;;
    spmm)    for p in reddit products; do
               run $py tools/bench_spmm.py --device cuda --preset "$p" --index-dtype int32 \
                 --reps 10 --steps 20 --out "$out/spmm_$p.json"
             done ;;
    solver)  run $py tools/experiments/bench_solver.py --device cuda --out "$out/solver.json" ;;
    e2e|e2e-reddit|e2e-products)
             presets="reddit products"; [ "$stage" != e2e ] && presets=${stage#e2e-}
             for p in $presets; do  # products: GCN in fp32, as in docs/benchmarks.md
               args="--epochs 100 --pyg"; [ "$p" = products ] && args="--epochs 60 --models gcn --amp none"
               run $py tools/bench_e2e.py --device cuda --preset "$p" $args --profile \
                 --out "$out/e2e_$p.json"
             done ;;
    grid)    for h in ${GRID:-0.18 0.19 0.20 0.21}; do
               run $py tools/experiments/tta_sweep.py yaml_configs/synthetic_200k_gcn.yaml --exact-only \
                 --seeds 0 --eval-every 2 --set train.device=cuda --set dataset.homophily="$h" \
                 --out "$out/grid_h$h.json"
             done ;;
    tta)     [ -n "$dry" ] && H=${H:-0.20}
             H=${H:-$($py tools/experiments/pick_homophily.py "$out"/grid_h*.json)} || { status=1; continue; }
             seeds=${TTA_SEEDS:-0 1 2}
             echo "homophily $H, seeds $seeds"
             run $py -m dgl_rsc run yaml_configs/synthetic_200k_gcn.yaml --device cuda --no-progress \
               --set dataset.homophily="$H" --set train.engine=pyg \
               --set "train.seeds=[${seeds// /,}]" --out "$out/tta_pyg" --force 2>&1 | tail -12
             run $py tools/experiments/tta_sweep.py yaml_configs/synthetic_200k_gcn.yaml --seeds $seeds \
               --eval-every 2 --set train.device=cuda --set dataset.homophily="$H" \
               --variant default: --variant cache1:cache_interval=1 --variant b03:budget=0.3 \
               --variant auto:budget=auto --out "$out/tta_native.json" ;;
    rem)     run $py tools/experiments/tta_sweep.py yaml_configs/synthetic_200k_gcn.yaml \
               --seeds ${TTA_SEEDS:-0 1 2 3 4} --eval-every 2 --set train.device=cuda \
               --variant default: --variant t10:tune_interval=10 --variant auto:budget=auto \
               --out "$out/tta_remainder.json" ;;
    now)     run $py tools/experiments/tta_sweep.py yaml_configs/synthetic_200k_gcn.yaml \
               --seeds ${TTA_SEEDS:-0 1 2 3 4} --eval-every 2 --set train.device=cuda \
               --variant default: --variant auto:budget=auto --variant sw09:switch_at=0.9 \
               --out "$out/tta_now.json" ;;
    pyg)     seeds=${PYG_SEEDS:-0 1}; tmp=$(mktemp -d)
             run $py -m dgl_rsc run yaml_configs/synthetic_200k_gcn.yaml --device cuda --no-progress \
               --set train.engine=pyg --set "train.seeds=[${seeds// /,}]" --out "$tmp/run" 2>&1 | tail -14
             for f in results.json metrics.csv table.txt; do
               [ -n "$dry" ] || cp "$tmp/run/$f" "$out/pyg_$f" || status=1
             done ;;
    mean)    run $py tools/interleaved_epochs.py yaml_configs/synthetic_200k_gcn.yaml --rounds 120 \
               --set train.device=cuda --variant default: --variant t10:tune_interval=10 \
               --out "$out/interleaved_200k.json" ;;
    forward) run $py tools/experiments/bench_forward.py --out "$out/forward.json" ;;
    precision) tmp=$(mktemp -d)
             for prec in fp32 bf16 int8; do
               case $prec in bf16) set_prec="train.amp=bf16" ;; *) set_prec="train.precision=$prec" ;; esac
               run $py -m dgl_rsc run yaml_configs/synthetic_200k_gcn.yaml --device cuda --no-progress \
                 --set train.epochs=${PREC_EPOCHS:-30} --set "$set_prec" --out "$tmp/$prec" 2>&1 | tail -6
               [ -n "$dry" ] || cp "$tmp/$prec/results.json" "$out/prec_$prec.json" || status=1
             done ;;
    fwdab)   for flag in "" --cusparse; do  # the forward kernel against cuSPARSE, same seeds
               run $py tools/experiments/tta_sweep.py yaml_configs/synthetic_200k_gcn.yaml $flag \
                 --seeds ${TTA_SEEDS:-0 1 2} --eval-every 2 --set train.device=cuda \
                 --variant default: --out "$out/fwdab${flag:-_kernel}.json"
             done ;;
    tta5)    run $py tools/experiments/tta_sweep.py yaml_configs/synthetic_200k_gcn.yaml \
               --seeds ${TTA_SEEDS:-0 1 2 3 4} --eval-every 2 --set train.device=cuda \
               --variant default: --out "$out/tta5_200k.json" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && { echo "stage $stage failed ($rc)"; status=1; }
done
exit $status
