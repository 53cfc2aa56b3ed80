#!/usr/bin/env bash
# The suite with the newest versions pip resolves, no constraints.txt: a dependency's new
# release that breaks tuner fails here before a user meets it (CI's main run is pinned).
# A fresh .venv-latest each time. It prints the versions that differ from constraints.txt
# (refresh those with bash .ci/lock.sh once this passes); when none differ, the pinned run
# already tested exactly these versions and the suite is not run twice, unless
# TUNER_LATEST_ALWAYS=1. Extra arguments go to pytest.
#
#   bash .ci/latest.sh            # or: TUNER_LATEST_ALWAYS=1 bash .ci/latest.sh tests/replay
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m venv --clear .venv-latest
. .venv-latest/bin/activate
pip install -q --upgrade --upgrade-strategy eager -e '.[test]'
changed="$(diff <(grep -v '^#' constraints.txt | sort -f) <(pip freeze --exclude-editable | sort -f) | grep '^[<>]' || true)"
if [ -z "$changed" ] && [ "${TUNER_LATEST_ALWAYS:-0}" != 1 ]; then
  echo "latest: the newest versions pip resolves are those in constraints.txt, which the pinned run tested"
  exit 0
fi
echo "latest: versions that differ from constraints.txt (< pinned, > newest):"
echo "${changed:-  none}"
pytest -q "$@"
