#!/usr/bin/env bash
# One device call of the second H200 calibration campaign (campaign.py beside this file):
#   bash benchmarks/h200/campaign.sh BUDGET_S
# needs the kit in /root/kit/p1..p6 (carried one part per call before, see README.md) and
# .campaign/ (python benchmarks/h200/campaign.py prepare) carried with this call; installs vLLM
# once per machine, makes the dummy-weight model folders once, measures what fits BUDGET_S
# (resumable), and returns /root/res as $OUT/h200-campaign.tgz.
set -o pipefail
T0=$(date +%s)
BUDGET=${1:-540}
RES=${RES:-/root/res}
KIT=${KIT:-/root/kit}
mkdir -p "$RES"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export TUNER_WORKLOAD_CACHE=$PWD/.campaign/workloads
echo "=== call at $(date -u +%FT%TZ), budget $BUDGET s" | tee -a "$RES/driver.log"
for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
  echo "killing leftover GPU process $pid" | tee -a "$RES/driver.log"; kill -9 "$pid" 2>/dev/null
done
if ! python3 -c 'import vllm' >/dev/null 2>&1; then
  bash "$KIT/p6/INSTALL.sh" "$KIT" 2>&1 | tail -5 | tee -a "$RES/install.log"
fi
if ! python3 -c 'import optuna' >/dev/null 2>&1 && ls /root/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /root/whl/*.whl 2>&1 | tail -3 | tee -a "$RES/install.log"
fi
if ! python3 -c 'import vllm, tuner.calibrate' >>"$RES/install.log" 2>&1; then
  echo "vllm or tuner does not import; see install.log"; tail -30 "$RES/install.log"
  tar czf "${OUT:-/tmp}/h200-campaign.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"; exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$RES/nvidia-smi.txt"
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
echo "ready after $(( $(date +%s) - T0 )) s; measuring for $LEFT s" | tee -a "$RES/driver.log"
timeout -k 8 -s TERM $(( LEFT + 20 )) python3 benchmarks/h200/campaign.py run --out "$RES" --budget-s "$LEFT" \
  --plan .campaign/plan.json --models /root/models --kit "$KIT/p6" 2>&1 | tee -a "$RES/driver.log"
echo "=== end at $(date -u +%FT%TZ) after $(( $(date +%s) - T0 )) s" | tee -a "$RES/driver.log"
tar czf "${OUT:-/tmp}/h200-campaign.tgz" --exclude='*.whl' -C "$(dirname "$RES")" "$(basename "$RES")"
ls -la "${OUT:-/tmp}"
