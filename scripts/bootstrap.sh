#!/usr/bin/env bash
# Make .venv and install pdtbench into it, from a fresh clone, with nothing installed by hand.
#
# torch: an existing torch (say a GPU user's CUDA build, visible through
# --system-site-packages) is kept and pinned for the rest of the install; where there is none,
# torch==2.13.0 is installed. Never a bare `torch`, which would pull a multi-GB CUDA build.
set -euo pipefail
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-dev}

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
fi
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "bootstrap: keeping the installed torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
else
  "$VENV/bin/python" -m pip install -q torch==2.13.0
fi
TORCH_VERSION=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
echo "torch==${TORCH_VERSION}" > "$VENV/torch-constraint.txt"
"$VENV/bin/python" -m pip install -q -c "$VENV/torch-constraint.txt" -e ".[${EXTRAS}]"
echo "bootstrap: ready ($VENV, torch ${TORCH_VERSION})"
