#!/usr/bin/env bash
# All the GPU evidence, sized for a 15-device-minute lease: one or two device calls
# (docs/gpu-session.md), each running as many parts as its budget allows, most valuable first.
#
#   bash scripts/gpu/session.sh [PART ...]         # on the device; default: every part not yet
#                                                  # run on this machine, in $DEFAULT_PARTS order
#   BUDGET_S=160 bash scripts/gpu/session.sh       # a second call on the warm machine: goes on
#                                                  # where the first stopped
#   DRY_RUN=1 bash scripts/gpu/session.sh          # here: every script's CPU steps
#
# It runs the four device scripts (kernels.sh, bench.sh, sdgp_semi.sh, reproduce.sh) part by
# part, after one environment report, wheel install and git restore for all of them:
#   compile       kernels.sh compile (fills CuPy's kernel cache before the tests run) and sass
#   check         at the same time, since none of them times anything: the CUDA kernels' GPU
#                 tests, the other GPU tests, SDGP's GPU tests, and racecheck then memcheck
#   kernel-bench  kernels.sh kernel-bench   (alone on the GPU, like every part below)
#   rows, iteration, pytest, asv            bench.sh's parts
#   figs          reproduce.sh clicktrain.fig9 clicktrain.fig10 sdgp.fig9 clicktrain.fig11
#   fig7          reproduce.sh prunetrain.fig7
#   sdgp-r18, sdgp-r50, sdgp-fp16           sdgp_semi.sh's timing steps
# A part that ran (ok, failed or cut) is noted in $STATE_DIR/ran (on the device, /tmp survives
# between calls while the machine stays warm) and left out of a later call that names no part;
# so is a part that an earlier lease's committed step table (reports/gpu/session/session-*/
# steps.tsv) records as ok. A part whose time is gone is "skipped: out of time budget", one
# whose script had a step skipped for time reads "partial"; both run in the next call.
# After each part its scripts' results are unpacked into one stage and $OUT/<tag>.tar.gz is
# rewritten (so a call killed later still returns what ended), and into the tree on the
# device, so clicktrain.fig11 reads the iteration rows. What comes back: <tag>.tar.gz (paths
# from the repository root: reports/gpu, reports/bench/gpu, reports/asv, reports/sdgp-semi,
# reports/gpu-scale), <tag>.log and <tag>-steps.tsv, <tag> = session-<UTC time>.
NAME=session
REPORT=reports/gpu
DEFAULT_BUDGET_S=510
RUN_TAG=${RUN_TAG:-session-$(date -u +%Y%m%dT%H%M%SZ)}
DEFAULT_PARTS="compile check kernel-bench rows iteration pytest asv figs fig7 sdgp-r18 \
sdgp-r50 sdgp-fp16"
# every module the four scripts import-check (their PREFLIGHT), checked once here
PREFLIGHT="impl.cuda.loader impl.cuda.nvrtc impl.cuda.sass_hazards impl.ops.pattern_cuda \
impl.ops.nm_cuda impl.ops.pack_cuda pytest \
bench.run bench.cases pytest_benchmark bench.sdgp_semi impl.methods.sdgp_semi reproductions \
reproductions.common impl.cli impl.report reproductions.clicktrain.fig9 \
reproductions.clicktrain.fig10 reproductions.sdgp.fig9 reproductions.clicktrain.fig11 \
reproductions.prunetrain.fig7"
PARTS=("$@")
for p in "${PARTS[@]}"; do
  [[ " $DEFAULT_PARTS " == *" $p "* ]] || { echo "unknown part '$p'; valid: $DEFAULT_PARTS" >&2; exit 2; }
done
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

STATE_DIR=${STATE_DIR:-/tmp/pdt-gpu-state}
[ "$DRY_RUN" = 1 ] && STATE_DIR=${DRY_STATE_DIR:-$WORK/state}   # a dry run leaves it alone
mkdir -p "$STATE_DIR" "$WORK/sub"
RAN=$STATE_DIR/ran
touch "$RAN"
export STATE_DIR

# sub PART SCRIPT [ARG ...]: run the device script SCRIPT (.sh) as one part (the caller sets
# ONLY_STEPS and the like before it). It gets the part's time less 15 s as its budget and
# keeps 10 s of that for packing: a step cut at its limit may take its 10 s of kill grace and
# still leave the script time to pack before the part's own limit. Its files go to
# $WORK/sub/PART, where `merge` finds them.
SUB_MARGIN_S=15
sub() {
  local part=$1 script=$2
  shift 2
  local budget=$(( ${STEP_LIMIT:-120} - SUB_MARGIN_S ))
  [ "$budget" -lt 1 ] && budget=1
  PART_OF=$TAG OUT="$WORK/sub/$part" COMMON_DONE=1 CALLER_HAVE_GPU=$HAVE_GPU CALLER_GPU_NAME=$GPU_NAME \
    BUDGET_S=${SUB_BUDGET_S:-$budget} RESERVE_S=10 bash "scripts/gpu/$script.sh" "$@"
}
# check: the three test runs and the sanitizers at once. Each test run gets the part's time as
# its step limit (slower side by side than alone) and xdist workers that add up to the 16
# cores. The two sanitizer runs go one after the other (racecheck under its own limit, then
# memcheck with the time left), so that no two compute-sanitizer instances look for the same
# local port at once.
check() {
  local b=$(( ${STEP_LIMIT:-240} - SUB_MARGIN_S ))
  local lim=$(( b - 15 ))
  export SUB_BUDGET_S=$b STEP_LIMIT_S=$lim
  together \
    "kernel-tests=ONLY_STEPS=tests XDIST_N=6 RUN_TAG=kernels-tests sub check-tests kernels" \
    "other-tests=ONLY_STEPS=tests-other XDIST_N=4 RUN_TAG=kernels-tests-other \
sub check-other kernels" \
    "sdgp-tests=ONLY_STEPS=tests XDIST_N=2 RUN_TAG=sdgp_semi-tests sub check-sdgp sdgp_semi" \
    "sanitizers=STEP_LIMIT_S= ONLY_STEPS='racecheck memcheck' RUN_TAG=kernels-sanitizers \
sub check-sanitizers kernels"
}
export SUB_MARGIN_S
export -f sub check

# merge: fold what the part's scripts wrote into the stage (and, on the device, into the
# tree), list their steps in status-extra.md, and rewrite $OUT/<tag>.tar.gz.
merge() {
  local d f tag
  : > "$WORK/part-steps.tsv"
  for d in "$WORK"/sub/*/; do
    [ -d "$d" ] || continue
    for f in "$d"*.tar.gz "$d"*.tar.gz.part0; do
      [ -e "$f" ] || continue
      tag=$(basename "${f%.tar.gz*}")
      # a tarball over 15 MiB comes in parts (finish in common.sh): x.tar.gz.part0, part1, ...
      local parts=("$f")
      [[ $f == *.part0 ]] && parts=("${f%0}"*)
      cat "${parts[@]}" | tar -xz -C "$STAGE" || echo "merge: could not unpack $f"
      [ "$HAVE_GPU" = 1 ] && [ "$DRY_RUN" != 1 ] && cat "${parts[@]}" | tar -xz -C "$ROOT"
      [ -f "$d$tag-steps.tsv" ] && tail -n +2 "$d$tag-steps.tsv" | sed "s/^/$tag\t/" \
        >> "$WORK/part-steps.tsv"
    done
    rm -rf "$d"
  done
  cat "$WORK/part-steps.tsv" >> "$WORK/substeps.tsv"
  if [ -s "$WORK/substeps.tsv" ]; then
    {
      echo "## The scripts' steps"
      echo
      echo "| script | step | kind | status | rc | seconds | limit (s) | note |"
      echo "|---|---|---|---|---|---|---|---|"
      awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8}' \
        "$WORK/substeps.tsv"
    } > "$SESSION/status-extra.md"
  fi
  # written beside, then renamed: a call killed mid-write keeps the previous tarball whole
  if pack_stage "$OUT/$TAG.tar.gz.tmp"; then
    mv -f "$OUT/$TAG.tar.gz.tmp" "$OUT/$TAG.tar.gz"
  else
    rm -f "$OUT/$TAG.tar.gz.tmp"
    echo "merge: could not write $OUT/$TAG.tar.gz"
  fi
}

# _has_row FILE FIELD VALUE [FIELD VALUE]: whether a row of the tab-separated FILE has VALUE
# in column FIELD (and the second pair too, when given).
_has_row() {
  awk -F'\t' -v f="$2" -v v="$3" -v g="${4:-0}" -v w="${5:-}" \
    '$f == v && (g == 0 || $g == w) { found = 1 } END { exit !found }' "$1"
}

# _relabel_last STATUS NOTE: the status and note of the step table's last row.
_relabel_last() {
  awk -F'\t' -v OFS='\t' -v s="$1" -v n="$2" 'NR == FNR { last = NR; next }
    FNR == last { $3 = s; $7 = n } { print }' "$STEPS" "$STEPS" > "$STEPS.tmp" &&
    mv "$STEPS.tmp" "$STEPS"
}

# part NAME LIMIT COMMAND: one part as a step, skipped when it ran in an earlier call (unless
# named on the command line), then merged, then noted in $RAN: as ok, failed or timeout, or
# not at all when it did not have its time: a step of its script was skipped for want of
# time, or the session's budget shortened the part's own limit and it, or a step of its
# script, ran out of time there with no step of it failing (the part then reads "partial" in
# the step table, and the next call runs it; a failure of its own is noted as such).
part() {
  local name=$1 limit=$2 cmd=$3 before failed_before=$_FAILED
  if [ ${#PARTS[@]} -eq 0 ] && before=$(grep -m1 "^$name " "$RAN"); then
    echo "[$name] skipped: ran earlier (${before#* })"
    _record "$name" part skipped "" 0 "$limit" "ran earlier: ${before#* }"
    return 0
  fi
  step "$name" part "$limit" "$cmd"
  merge
  if [ "$STEP_STATUS" = ok ] && grep -q $'\tout of time budget$' "$WORK/part-steps.tsv"; then
    echo "[$name] partial: a step of its script had no time left; the next call runs it"
    _relabel_last partial "a step had no time left"
    return 0
  fi
  if [ "$STEP_SHORTENED" = 1 ] &&
    ! _has_row "$WORK/part-steps.tsv" 4 failed &&
    { [ "$STEP_STATUS" = timeout ] || _has_row "$WORK/part-steps.tsv" 4 timeout; }; then
    echo "[$name] partial: the budget left it less than its ${limit}s and it ended" \
      "$STEP_STATUS; the next call runs it"
    _relabel_last partial "$STEP_STATUS within a shortened limit (own limit ${limit}s)"
    _FAILED=$failed_before   # for want of time, not a failure
    return 0
  fi
  case $STEP_STATUS in
    ok | failed | timeout) echo "$name $STEP_STATUS $(date -u +%FT%TZ)" >> "$RAN" ;;
  esac
}

# Parts that ended ok in an earlier lease, as its committed step tables say (the device's copy
# of the tree holds them), count as run: each lease's first call goes on from there. Not in a
# dry run, unless EARLIER_STEPS names the tables.
if [ "$DRY_RUN" != 1 ] || [ -n "${EARLIER_STEPS:-}" ]; then
  for f in ${EARLIER_STEPS:-reports/gpu/session/session-*/steps.tsv}; do
    [ -f "$f" ] || continue
    awk -F'\t' -v src="$f" '$2 == "part" && $3 == "ok" {print $1 " ok in an earlier lease (" src ")"}' \
      "$f" >> "$RAN"
  done
fi

# The environment report (torch, CUDA, CuPy, the preflight imports: 15-30 s) is the same for
# every call on one machine: the first call's tarball has it, a later call skips it.
ENV_MARK=$STATE_DIR/env-reported
[ -f "$ENV_MARK" ] && export ENV_REPORTED="reported by an earlier call on this machine ($(cat "$ENV_MARK"))"
common_steps
[ -z "${ENV_REPORTED:-}" ] && [ "${COMMON_DONE:-0}" != 1 ] &&
  _has_row "$STEPS" 1 env 3 ok &&
  echo "$TAG $(date -u +%FT%TZ)" > "$ENV_MARK"
if [ "$HAVE_GPU" != 1 ] && [ "$DRY_RUN" != 1 ]; then
  echo "== no GPU: no part runs (DRY_RUN=1 runs every script's CPU steps)"
  exit 2
fi
if stale_tree_refused; then
  exit 2   # seconds of the lease spent, not a call of results named after the wrong commit
fi
export COMMON_DONE=1
SELECTED=${PARTS[*]:-$DEFAULT_PARTS}
for p in $DEFAULT_PARTS; do
  [[ " $SELECTED " == *" $p "* ]] || continue
  case $p in
    compile) part compile 130 "ONLY_STEPS='compile sass' RUN_TAG=kernels-compile \
sub compile kernels" ;;
    check) part check 240 check ;;
    kernel-bench) part kernel-bench 110 "ONLY_STEPS=kernel-bench RUN_TAG=kernels-bench \
sub kernel-bench kernels" ;;
    rows) part rows 140 "sub rows bench rows" ;;
    iteration) part iteration 200 "sub iteration bench iteration" ;;
    pytest) part pytest 110 "sub pytest bench pytest" ;;
    asv) part asv 170 "sub asv bench asv" ;;
    figs) part figs 240 "RUN_TAG=reproduce-figs sub figs reproduce clicktrain.fig9 \
clicktrain.fig10 sdgp.fig9 clicktrain.fig11" ;;
    fig7) part fig7 200 "RUN_TAG=reproduce-fig7 sub fig7 reproduce prunetrain.fig7" ;;
    sdgp-r18) part sdgp-r18 140 "ONLY_STEPS=r18-bf16 RUN_TAG=sdgp_semi-r18 sub sdgp-r18 sdgp_semi" ;;
    sdgp-r50) part sdgp-r50 170 "ONLY_STEPS=r50-bf16 RUN_TAG=sdgp_semi-r50 sub sdgp-r50 sdgp_semi" ;;
    sdgp-fp16) part sdgp-fp16 140 "ONLY_STEPS=fp16 RUN_TAG=sdgp_semi-fp16 sub sdgp-fp16 sdgp_semi" ;;
  esac
done
