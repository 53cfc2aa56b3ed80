#!/usr/bin/env bash
# A stand-in for `vllm serve` on a machine without GPUs (dry_run.py): it records what tuner's launcher gave
# it (its argv and CUDA_VISIBLE_DEVICES, one JSON line in $STAND_IN_LOG), then runs `tuner sim-serve` with the
# same flags, simulating the GPU kind in $STAND_IN_GPU, as one replica of the layout would run on a real host.
#   --vllm-cmd "bash benchmarks/h200/multi_gpu/stand_in.sh {model}"
set -euo pipefail
python3 - "$@" <<'PY' >> "${STAND_IN_LOG:?set STAND_IN_LOG}"
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "pid": os.getppid()}))
PY
exec "${STAND_IN_PYTHON:-python3}" -m tuner sim-serve --speed "${STAND_IN_SPEED:-40}" --gpu "${STAND_IN_GPU:-H100-SXM}" \
  --vllm-version 0.26.0 "$@"
