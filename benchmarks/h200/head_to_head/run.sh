#!/usr/bin/env bash
# One device call of the head-to-head (README.md beside this file), resumable across calls and sessions:
#   bash benchmarks/h200/head_to_head/run.sh STRATEGY BUDGET_S      STRATEGY: defaults | article | tuner
#   CONFIRM=0 (no confirmation repeats), WARM=sim (tuner: try the simulator study's best first), TRIALS=N
# Needs the vLLM kit's parts in /root/kit/p* (carried one per call before) and .h2h/ carried with this call
# (.h2h/whl: tuner's wheels the image lacks; .h2h/state/h2h.db: the study of earlier sessions, if any).
# Installs vLLM and tuner's wheels once per machine, makes the dummy-weight Qwen2.5-14B folder once, then runs
# `tuner search --backend vllm` on the strategy's space (space-STRATEGY.yaml) into one SQLite file, bounded by
# tuner's own --timeout (a trial or a repeat starts only when it fits; exit 124 leaves the rest to the next
# call). Every strategy's study holds its own trials and its confirmation repeats (three fresh starts of its
# pick, tuner's replayer, the same trace and target). Returns /root/res as $OUT/h2h.tgz.
set -o pipefail
T0=$(date +%s)
STRATEGY=${1:?usage: run.sh defaults|article|tuner BUDGET_S}
BUDGET=${2:-560}
HERE=benchmarks/h200/head_to_head
RES=${RES:-/root/res}
KIT=${KIT:-/root/kit}
MODELS=${MODELS:-/root/models}
mkdir -p "$RES"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
log() { echo "$*" | tee -a "$RES/driver.log"; }
pack() { tar czf "${OUT:-/tmp}/h2h.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"; ls -la "${OUT:-/tmp}"; }
log "=== $STRATEGY call at $(date -u +%FT%TZ), budget $BUDGET s"
if [ ! -f "$RES/h2h.db" ] && [ -f .h2h/state/h2h.db ]; then cp .h2h/state/h2h.db "$RES/h2h.db"; log "resumed .h2h/state/h2h.db"; fi
for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
  log "killing leftover GPU process $pid"; kill -9 "$pid" 2>/dev/null
done
install=$(ls "$KIT"/p*/INSTALL.sh 2>/dev/null | head -n 1)
if ! python3 -c 'import vllm' >/dev/null 2>&1; then
  [ -n "$install" ] || { log "no kit in $KIT (carry .kit/pN first)"; pack; exit 1; }
  bash "$install" "$KIT" 2>&1 | tail -5 | tee -a "$RES/install.log"
fi
if ! python3 -c 'import optuna' >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .h2h/whl/*.whl 2>&1 \
    | tail -3 | tee -a "$RES/install.log"
fi
python3 - "$MODELS" "$(dirname "$install")" >>"$RES/install.log" 2>&1 <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/h200")
import campaign  # noqa: E402  (the campaigns' model folders: tuner's preset config + the kit's tokenizer)
print(campaign.make_models(Path(sys.argv[1]), Path(sys.argv[2]), {"qwen2.5-14b"}))
EOF
if ! python3 -c 'import vllm, optuna, tuner' >>"$RES/install.log" 2>&1; then
  log "vllm, optuna or tuner does not import; see install.log"; tail -30 "$RES/install.log"; pack; exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$RES/nvidia-smi.txt"
# the card lent names the deployment (the spaces say H100-SXM): an H200's studies are H200 studies
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" in *H200*) GPU=H200 ;; *) GPU=H100-SXM ;; esac
VLLM="$(dirname "$(command -v python3)")/vllm"
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
BUDGET_TRIALS=1; [ "$STRATEGY" = tuner ] && BUDGET_TRIALS=${TRIALS:-8}
log "ready after $(( $(date +%s) - T0 )) s; $STRATEGY on $GPU for $LEFT s"
timeout -k 8 -s TERM $(( LEFT - 5 )) python3 -m tuner search --backend vllm \
  --vllm-cmd "$VLLM serve --load-format dummy" --model "$MODELS/qwen2.5-14b" --gpu "$GPU" --space "$HERE/space-$STRATEGY.yaml" \
  --budget "$BUDGET_TRIALS" --timeout $(( LEFT - 20 )) --storage "sqlite:///$RES/h2h.db" --study "h2h-$GPU-$STRATEGY" \
  ${CONFIRM:+--confirm "$CONFIRM"} ${WARM:+--warm-start "$WARM"} --output json > "$RES/$STRATEGY-$(date +%s).json" 2>> "$RES/driver.log"
log "$STRATEGY search exit $?"
python3 -m tuner studies show "h2h-$GPU-$STRATEGY" --storage "sqlite:///$RES/h2h.db" > "$RES/show-$STRATEGY.txt" 2>&1
log "GPU processes left: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l);" \
    "vllm serve processes left: $(ps -eo args | grep -c '[v]llm serve')"
cp -r studies "$RES/" 2>/dev/null
log "=== end at $(date -u +%FT%TZ) after $(( $(date +%s) - T0 )) s"
pack
