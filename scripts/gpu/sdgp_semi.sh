#!/usr/bin/env bash
# SDGP's data gradient on 2:4 sparse tensor cores, measured.
#
#   bash scripts/gpu/sdgp_semi.sh          # on the device (docs/gpu-session.md)
#   DRY_RUN=1 bash scripts/gpu/sdgp_semi.sh   # here: the CPU steps only
#
# Steps (each under a time limit, in order of value; a failure is recorded and the next runs):
#   tests      pytest -m gpu of tests/test_sdgp_semi.py, test_sdgp.py, test_sdgp_timing.py (the
#              sparse product against float64, the model step under autocast) -> tests.{xml,log}
#   r18-bf16   python -m bench.sdgp_semi --models resnet18 --dtypes bf16: every distinct conv of
#              ResNet-18 at the paper's batch 256, 224 x 224 (SDGP Fig. 9), and whole training
#              iterations -> rows.{csv,json}, summary.md
#   r50-bf16   the same for ResNet-50 -> resnet50/
#   fp16       both models in fp16, layers only -> fp16/ (the default budget leaves it little
#              or no time: skipped "out of time budget", or cut keeping its rows)
# A step cut by its limit keeps the rows it measured (rows.partial.jsonl, rows.json with
# "complete": false and "cut_at"; see bench/sdgp_semi.py).
# all under reports/sdgp-semi/<gpu>/ (e.g. nvidia-h100-80gb-hbm3); they come back as
# $OUT/sdgp_semi.tar.gz (paths from the repository root), sdgp_semi.log, sdgp_semi-steps.tsv.
# One `python -m bench.sdgp_semi --out reports/sdgp-semi/<gpu>` (docs/sdgp_semi.md) would do
# all of it in one table; split here so that a time limit cuts the least important part.
NAME=sdgp_semi
REPORT=reports/sdgp-semi/@DEVICE@
DEFAULT_BUDGET_S=330
PREFLIGHT="bench.sdgp_semi impl.methods.sdgp_semi impl.ops.nm_cuda pytest"
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

XDIST=$(xdist_args 4)

common_steps
step tests gpu 75 "\"$PY\" -m pytest -q -p no:cacheprovider -m gpu tests/test_sdgp_semi.py \
  tests/test_sdgp.py tests/test_sdgp_timing.py $XDIST --junitxml=\"$DEST/tests.xml\" \
  | tee \"$DEST/tests.log\""
step r18-bf16 gpu 120 "\"$PY\" -m bench.sdgp_semi --models resnet18 --dtypes bf16 --out \"$DEST\""
step r50-bf16 gpu 150 "\"$PY\" -m bench.sdgp_semi --models resnet50 --dtypes bf16 \
  --out \"$DEST/resnet50\""
step fp16 gpu 120 "\"$PY\" -m bench.sdgp_semi --dtypes fp16 --no-iteration --out \"$DEST/fp16\""
