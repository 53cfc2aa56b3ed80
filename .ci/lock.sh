#!/usr/bin/env bash
# Refreshes constraints.txt: the exact versions that CI (.ci/run) and README's install
# commands use. Builds a fresh virtual environment with the newest versions pip resolves
# for tuner and its test extra, and writes them, frozen, without tuner itself. Then run
# the suite (pytest -q, or .ci/run) and commit constraints.txt with what it changed.
#
#   bash .ci/lock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q -e '.[test]'
{
  echo "# Exact versions of tuner's dependencies and test extra, for"
  echo "#   pip install -e '.[test]' -c constraints.txt   (README's commands, .ci/run)"
  echo "# Written by 'bash .ci/lock.sh' ($("$tmp/venv/bin/python" -V), $(date -u +%Y-%m-%d)); do not edit by hand."
  "$tmp/venv/bin/pip" freeze --exclude-editable
} > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "wrote constraints.txt ($(grep -vc '^#' constraints.txt) packages)"
