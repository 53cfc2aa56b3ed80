#!/usr/bin/env bash
# One device call of the H200 calibration (see README beside this file):
#   bash benchmarks/h200/run.sh BUDGET_S
# installs the vLLM kit from /root/kit once per machine, makes the dummy-weight model once,
# runs the trials that fit BUDGET_S (resumable), and returns /root/res as $OUT/h200-res.tgz.
set -o pipefail
T0=$(date +%s)
BUDGET=${1:-560}
RES=${RES:-/root/res}
KIT=${KIT:-/root/kit}
MODEL=${MODEL:-/root/model}
mkdir -p "$RES"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
echo "=== call at $(date -u +%FT%TZ), budget $BUDGET s" | tee -a "$RES/driver.log"
# a server of ours left from an earlier call (killed mid-run) still holds the GPU: end it by pid
for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
  echo "killing leftover GPU process $pid" | tee -a "$RES/driver.log"; kill -9 "$pid" 2>/dev/null
done
if [ -z "${SKIP_INSTALL:-}" ] && ! python3 -c 'import vllm' >/dev/null 2>&1; then
  bash "$KIT/p6/INSTALL.sh" "$KIT" 2>&1 | tee -a "$RES/install.log"
fi
if [ ! -f "$MODEL/config.json" ]; then
  python3 "$KIT/p6/make_model.py" "$MODEL" 2>&1 | tee -a "$RES/install.log"
fi
nvidia-smi 2>&1 | tee -a "$RES/nvidia-smi.txt" >/dev/null
if [ -z "${SKIP_INSTALL:-}" ] && ! python3 -c 'import vllm' >>"$RES/install.log" 2>&1; then
  echo "vllm does not import; see install.log"; tail -30 "$RES/install.log"
  tar czf "${OUT:-/tmp}/h200-res.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"; exit 1
fi
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
echo "install/model ready after $(( $(date +%s) - T0 )) s; measuring for $LEFT s" | tee -a "$RES/driver.log"
timeout -k 8 -s TERM $(( LEFT + 25 )) python3 benchmarks/h200/measure.py --model "$MODEL" --out "$RES" \
  --budget-s "$LEFT" ${MEASURE_ARGS:-} 2>&1 | tee -a "$RES/driver.log"
echo "=== end at $(date -u +%FT%TZ) after $(( $(date +%s) - T0 )) s" | tee -a "$RES/driver.log"
tar czf "${OUT:-/tmp}/h200-res.tgz" -C "$(dirname "$RES")" "$(basename "$RES")"
ls -la "${OUT:-/tmp}"
