#!/usr/bin/env bash
# One device call of a real `tuner search --backend vllm` study on the H200, with the simulator
# as predictor (resumable: a second call tops the study up):
#   bash benchmarks/h200/search.sh BUDGET_S TRIALS
# installs the vLLM kit from /root/kit and tuner's missing wheels from /root/whl once per
# machine, makes the dummy-weight model once, runs the study in /root/res/search.db until
# TRIALS finished trials or BUDGET_S, returns /root/res as $OUT/h200-search.tgz.
# The run is bounded by tuner's own --timeout (what is left of BUDGET_S less 20 s): tuner
# starts a trial or a confirmation repeat only when the study's measured trials say it fits,
# and exits 124 when the window closes with work left (search/window.py). The outer
# `timeout` is only a guard. STUDY names the study (default h200-predict).
set -o pipefail
T0=$(date +%s)
BUDGET=${1:-560}
TRIALS=${2:-12}
RES=${RES:-/root/res}
KIT=${KIT:-/root/kit}
MODEL=${MODEL:-/root/model}
mkdir -p "$RES"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
echo "=== call at $(date -u +%FT%TZ), budget $BUDGET s" | tee -a "$RES/search.log"
for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
  echo "killing leftover GPU process $pid" | tee -a "$RES/search.log"; kill -9 "$pid" 2>/dev/null
done
if ! python3 -c 'import vllm' >/dev/null 2>&1; then
  bash "$KIT/p6/INSTALL.sh" "$KIT" 2>&1 | tee -a "$RES/install.log"
fi
if ! python3 -c 'import optuna' >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /root/whl/*.whl 2>&1 | tee -a "$RES/install.log"
fi
if [ ! -f "$MODEL/config.json" ]; then
  python3 "$KIT/p6/make_model.py" "$MODEL" 2>&1 | tee -a "$RES/install.log"
fi
if ! python3 -c 'import vllm, optuna, tuner' >>"$RES/install.log" 2>&1; then
  echo "vllm, optuna or tuner does not import; see install.log"; tail -30 "$RES/install.log"
  tar czf "${OUT:-/tmp}/h200-search.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"; exit 1
fi
VLLM="$(dirname "$(command -v python3)")/vllm"
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
STUDY=${STUDY:-h200-predict}
echo "ready after $(( $(date +%s) - T0 )) s; searching for $LEFT s" | tee -a "$RES/search.log"
timeout -k 8 -s TERM $(( LEFT - 5 )) python3 -m tuner search --backend vllm --vllm-cmd "$VLLM serve --load-format dummy" \
  --model "$MODEL" --space benchmarks/h200/search-space.yaml --budget "$TRIALS" --timeout $(( LEFT - 20 )) \
  --storage "sqlite:///$RES/search.db" --study "$STUDY" --output json > "$RES/search-$(date +%s).json" 2>> "$RES/search.log"
echo "search exit $?" | tee -a "$RES/search.log"
python3 -m tuner studies show "$STUDY" --storage "sqlite:///$RES/search.db" > "$RES/show-$(date +%s).txt" 2>&1
python3 -m tuner studies show "$STUDY" --storage "sqlite:///$RES/search.db" -o json > "$RES/show-$(date +%s).json" 2>&1
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader > "$RES/gpu-after-$(date +%s).txt" 2>&1
ps -eo pid,args | grep -c "[v]llm serve" > "$RES/vllm-left-$(date +%s).txt"
cp -r studies "$RES/" 2>/dev/null
echo "=== end at $(date -u +%FT%TZ) after $(( $(date +%s) - T0 )) s" | tee -a "$RES/search.log"
tar czf "${OUT:-/tmp}/h200-search.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"
ls -la "${OUT:-/tmp}"
