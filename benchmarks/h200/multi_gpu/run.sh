#!/usr/bin/env bash
# One device call of issue 52's campaign on a host of eight GPUs (README.md beside this file), resumable:
#   bash benchmarks/h200/multi_gpu/run.sh STEP BUDGET_S     STEP: article004 | azure | fixed | plan
# Needs the vLLM kit's parts in /root/kit/p* (carried one per call before, as the head-to-head does) and
# .h2h/ carried with this call (.h2h/whl: tuner's wheels; .h2h/state/multi-gpu.db: earlier calls' studies).
# article004/azure/fixed: `tuner search --backend vllm --gpus N` on space-STEP.yaml, one SQLite file, bounded by
# tuner's --timeout (exit 124 leaves the rest to the next call); plan: `tuner plan --target-ttft 5s` on each
# study's winner. NVLink multicast stays off (the device notes: it can take a shared host's GPUs down).
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)
STEP=${1:?usage: run.sh article004|azure|fixed|plan BUDGET_S}
BUDGET=${2:-560}
HERE=benchmarks/h200/multi_gpu
RES=${RES:-/root/res}; KIT=${KIT:-/root/kit}; MODELS=${MODELS:-/root/models}
DB="sqlite:///$RES/multi-gpu.db"
mkdir -p "$RES"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
log() { echo "$*" | tee -a "$RES/driver.log"; }
pack() { tar czf "${OUT:-/tmp}/multi-gpu.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"; }
log "=== $STEP call at $(date -u +%FT%TZ), budget $BUDGET s"
[ -f "$RES/multi-gpu.db" ] || [ ! -f .h2h/state/multi-gpu.db ] || cp .h2h/state/multi-gpu.db "$RES/multi-gpu.db"
install=$(ls "$KIT"/p*/INSTALL.sh 2>/dev/null | head -n 1)
if ! python3 -c 'import vllm' >/dev/null 2>&1; then
  [ -n "$install" ] || { log "no kit in $KIT (carry .kit/pN first)"; pack; exit 1; }
  bash "$install" "$KIT" 2>&1 | tail -5 | tee -a "$RES/install.log"
fi
python3 -c 'import optuna' >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --target /tmp/site .h2h/whl/*.whl 2>&1 | tail -3 | tee -a "$RES/install.log"
python3 - "$MODELS" "$(dirname "$install")" >>"$RES/install.log" 2>&1 <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/h200")
import campaign  # noqa: E402  (the campaigns' model folders: tuner's preset config + the kit's tokenizer)
print(campaign.make_models(Path(sys.argv[1]), Path(sys.argv[2]), {"llama-2-7b"}))
PY
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
nvidia-smi topo -m > "$RES/topology.txt" 2>&1
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" in *H200*) GPU=H200 ;; *) GPU=H100-SXM ;; esac
VLLM="$(dirname "$(command -v python3)")/vllm serve --load-format dummy"
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
log "ready after $(( $(date +%s) - T0 )) s; $STEP on $N x $GPU for $LEFT s"
common=(--backend vllm --vllm-cmd "$VLLM" --model "$MODELS/llama-2-7b" --gpu "$GPU" --gpus "$N" --storage "$DB")
if [ "$STEP" = plan ]; then
  for s in article004 azure fixed; do
    timeout -k 8 $(( LEFT / 3 )) python3 -m tuner plan --target-ttft 5s --backend vllm --vllm-cmd "$VLLM" \
      --storage "$DB" --study "mg-$N-$GPU-$s" --no-files --output json > "$RES/plan-$s.json" 2>> "$RES/driver.log"
    log "plan $s exit $?"
  done
else
  space="$HERE/space-$STEP.yaml"
  if [ "$N" -lt 8 ]; then  # fewer GPUs (a -x2 or -x4 kind): every layout that fits them, the question in part
    space="$HERE/space-$STEP-$N.yaml"; sed 's/^layouts: .*/layouts: auto/' "$HERE/space-$STEP.yaml" > "$space"
  fi
  timeout -k 8 -s TERM $(( LEFT - 5 )) python3 -m tuner search "${common[@]}" --space "$space" \
    --study "mg-$N-$GPU-$STEP" --budget "${TRIALS:-8}" --confirm "${CONFIRM:-1}" --timeout $(( LEFT - 20 )) \
    --output json > "$RES/$STEP-$(date +%s).json" 2>> "$RES/driver.log"
  log "$STEP search exit $?"
  python3 -m tuner studies show "mg-$N-$GPU-$STEP" --storage "$DB" > "$RES/show-$STEP.txt" 2>&1
fi
log "GPU processes left: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
cp -r studies "$RES/" 2>/dev/null
log "=== end after $(( $(date +%s) - T0 )) s"
pack
