#!/usr/bin/env bash
# The gpu-scale reproductions that need a GPU: ClickTrain Figs. 9-11, SDGP Fig. 9 and
# PruneTrain Fig. 7 (per-layer timing of untrained ResNet-50s, dense and in PruneTrain's
# reconfigured state), rendered as HTML.
#
#   bash scripts/gpu/reproduce.sh [TARGET ...]   # on the device (docs/gpu-session.md);
#                                                # default: the five targets below
#   DRY_RUN=1 bash scripts/gpu/reproduce.sh      # here: the CPU steps only
#
# One step per target (`python -m impl.cli reproduce <target> --scale gpu`); at gpu scale none
# trains (prunetrain.fig7 builds ResNet-50 untrained in PruneTrain's reconfigured state, last
# so that a tight budget cuts it first). clicktrain.fig11 reads
# the iteration rows of bench.sh (reports/bench/gpu/iteration/rows.json, when call 2's files
# were extracted into the tree before this call) or times the same 14 pairs itself; runs go to
# runs/gpu-scale/ in the device's copy, so a second call on a warm machine reuses the complete
# ones. A target that fails inside `reproduce` (which records it and goes on) fails its step.
# Then `render` draws every saved result into reports/gpu-scale/*.html (an index that lists
# every target, run or not; it trains and measures nothing) and copies the results
# (result.json) to reports/gpu-scale/results/. Back as $OUT/reproduce.tar.gz, reproduce.log and
# reproduce-steps.tsv.
NAME=reproduce
REPORT=reports/gpu-scale
DEFAULT_BUDGET_S=210
RENDER_S=${RENDER_S:-35}   # kept by every target for render (its 15-s floor and its run)
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(clicktrain.fig9 clicktrain.fig10 sdgp.fig9 \
  clicktrain.fig11 prunetrain.fig7)
PREFLIGHT="reproductions reproductions.common impl.cli impl.report"
for t in "${TARGETS[@]}"; do
  PREFLIGHT="$PREFLIGHT reproductions.${t}"
done
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
RUNS=${RUNS_ROOT:-runs/gpu-scale}
[ "$DRY_RUN" = 1 ] && RUNS=${RUNS_ROOT:-$WORK/runs}   # a dry run leaves the tree alone
export RUNS

# reproduce T: run one target at gpu scale; fail when reproduce recorded it as FAILED.
reproduce_target() {
  local log="$WORK/reproduce-$1.log"
  "$PY" -m impl.cli reproduce "$1" --scale gpu --runs-root "$RUNS" --out "$WORK/scratch" \
    2>&1 | tee "$log" || return 1
  ! grep -q "\] FAILED" "$log"
}
render() {
  mkdir -p "$RUNS/results"
  "$PY" -c "import sys; from reproductions import expected_targets as e
from reproductions.common import render
print('report:', render(sys.argv[1], sys.argv[2], expected=e('gpu')))" "$RUNS" "$DEST" || return 1
  mkdir -p "$DEST/results"
  cp -r "$RUNS/results/." "$DEST/results/"
}
export -f reproduce_target render

common_steps
for t in "${TARGETS[@]}"; do
  case $t in
    prunetrain.fig7) kind=gpu limit=120 ;;   # two untrained ResNet-50s, 16 convs timed
    clicktrain.table* | prunetrain.table* | campfire.* | cross.*) kind=gpu limit=300 ;;
    clicktrain.fig11) kind=gpu limit=120 ;;   # 14 iteration pairs, or bench.sh's rows
    *) kind=gpu limit=120 ;;
  esac
  # each target keeps RENDER_S for render: a target cut by the budget must not leave the
  # finished ones unrendered (render is what brings them back as pages and results)
  RESERVE_S=$((RESERVE_S + RENDER_S)) step "$t" "$kind" "$limit" "reproduce_target $t"
done
RESERVE_S=5 step render cpu 60 render
