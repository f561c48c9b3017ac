# Shared set-up of the device scripts (scripts/gpu/<name>.sh); sourced, never run alone.
#
# The caller sets NAME (the script's name), REPORT (the folder under the repository root where
# its results belong, e.g. reports/gpu; "@DEVICE@" in it becomes the GPU's name as a slug, e.g.
# nvidia-h100-80gb-hbm3), DEFAULT_BUDGET_S and optionally PREFLIGHT (modules to import-check)
# and RUN_TAG, then sources this file, calls `common_steps` and `step` once per piece of work;
# `finish` runs at exit. See docs/gpu-session.md.
#
# Environment (all optional):
#   OUT          folder whose files come back from the device (the device sets it); default: a
#                new temporary folder (a CPU dry run)
#   PY           the Python that holds torch (default python3: /opt/torch/.venv/bin/python3 there)
#   DRY_RUN=1    run only the cheap CPU steps; every GPU step is reported "skipped"
#   BUDGET_S     seconds the whole script may take (default DEFAULT_BUDGET_S); each step's own
#                limit is cut to what is left, keeping RESERVE_S (default 30) for packaging
#   GPU_SITE     where the carried wheels are installed (default /tmp/site)
#   WHEELS=0     install no wheels (a machine of one's own, with the stack installed: make gpu-check)
#   ONLY_STEPS   space-separated step names: run only these (and the standard first steps);
#                the others are left out silently (scripts/gpu/session.sh runs a script's
#                steps in separate parts this way)
#   STEP_LIMIT_S every step's limit in place of its own (the budget still cuts it)
#   COMMON_DONE=1  the caller already ran env, wheels and git on this machine: skip them
#
# Every step runs under `timeout`; its output goes to the console and to
# $REPORT/session/<tag>/logs/<step>.log (<tag>: RUN_TAG, else NAME); a failed or timed-out
# step is recorded and the script goes on. `finish` writes $REPORT/session/<tag>/ (steps.tsv,
# STATUS.md, console.log; env.json comes from the env step), tars the staged results (paths
# relative to the repository root) into $OUT/<tag>.tar.gz (split in 15 MiB parts if larger),
# copies the step table and the console log beside it as <tag>-steps.tsv and <tag>.log, prints
# the step table last and exits 0 (every step ok, or skipped for want of a GPU or of time), 1
# (a step failed or timed out) or 2 (no GPU visible on a run that is not a dry run).

set -u
set -o pipefail
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg

: "${NAME:?set NAME before sourcing common.sh}"
: "${REPORT:?set REPORT before sourcing common.sh}"

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
ROOT=$PWD
PY=${PY:-python3}
DRY_RUN=${DRY_RUN:-0}
BUDGET_S=${BUDGET_S:-${DEFAULT_BUDGET_S:-540}}
RESERVE_S=${RESERVE_S:-30}
# Whole seconds: a fraction (a budget worked out from a status's float) is cut off, anything
# else stops here, where shell arithmetic would fail every step and still exit 0.
for _v in BUDGET_S RESERVE_S; do
  [[ ${!_v} =~ ^[0-9]+\.[0-9]*$ ]] && printf -v "$_v" '%s' "${!_v%%.*}"
  if ! [[ ${!_v} =~ ^[0-9]+$ ]]; then
    echo "== $NAME: $_v must be a whole number of seconds, got '${!_v}'" >&2
    exit 2
  fi
done
SITE=${GPU_SITE:-/tmp/site}
T0=$SECONDS
if [ -z "${OUT:-}" ]; then
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/pdt-gpu-out.XXXXXX")
fi
mkdir -p "$OUT"
# -- GPU detection (torch can use one) -------------------------------------------------------
HAVE_GPU=0
GPU_NAME=""
if [ "${COMMON_DONE:-0}" = 1 ] && [ -n "${CALLER_HAVE_GPU:-}" ]; then
  HAVE_GPU=$CALLER_HAVE_GPU   # the caller (session.sh) looked already
  GPU_NAME=${CALLER_GPU_NAME:-}
else
  # torch decides (nvidia-smi, where it is on the PATH, only names the GPU): a machine whose
  # nvidia-smi is elsewhere still runs its GPU steps.
  _nv=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    _nv=1
    GPU_NAME=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  fi
  compgen -G "/dev/nvidia[0-9]*" >/dev/null && _nv=1
  if [ "$_nv" = 1 ]; then   # (neither: a CPU machine, where importing torch is time spent)
    _torch_gpu=$(timeout 120 "$PY" -c 'import torch
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null)
    if [ -n "$_torch_gpu" ]; then
      HAVE_GPU=1
      GPU_NAME=${GPU_NAME:-$_torch_gpu}
    fi
  fi
fi
# A name for folders: "NVIDIA H100 80GB HBM3" -> nvidia-h100-80gb-hbm3.
DEVICE_SLUG=${DEVICE_SLUG:-$(printf '%s' "${GPU_NAME:-no-gpu}" | tr '[:upper:]' '[:lower:]' \
  | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//')}
export HAVE_GPU GPU_NAME DEVICE_SLUG
REPORT=${REPORT//@DEVICE@/$DEVICE_SLUG}   # e.g. reports/sdgp-semi/@DEVICE@

TAG=${RUN_TAG:-$NAME}       # names the tarball and the session folder (bench.sh sets RUN_TAG)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pdt-gpu-$NAME.XXXXXX")
STAGE=$WORK/stage           # mirrors the repository: results land in $STAGE/$REPORT/...
DEST=$STAGE/$REPORT
SESSION=$DEST/session/$TAG
mkdir -p "$SESSION/logs"
STEPS=$SESSION/steps.tsv
printf 'step\tkind\tstatus\trc\tseconds\tlimit_s\tnote\n' > "$STEPS"

# The project from the working tree, the carried wheels beside it; asv passes ASV_PYTHONPATH
# (not PYTHONPATH) to its benchmark processes.
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export ASV_PYTHONPATH="$ROOT:$SITE"
# git refuses a repository owned by another user ("dubious ownership"): the copy may be one.
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'
export ROOT PY DRY_RUN SITE STAGE DEST SESSION OUT WORK TAG
# Without git on the machine, provenance still names the commit the copy was made at.
[ -f .gpu/commit.txt ] && [ -z "${PDTBENCH_COMMIT:-}" ] && PDTBENCH_COMMIT=$(cat .gpu/commit.txt)
export PDTBENCH_COMMIT=${PDTBENCH_COMMIT:-}

# The console tee ignores the stop signals: a caller's `timeout` signals this script's whole
# process group, and a tee that died with it would take `finish` down with a broken pipe
# (no tarball, nothing of the steps that ended). It ends when this script closes its output.
exec > >(trap '' TERM INT HUP; exec tee -a "$WORK/console.log") 2>&1
_TEE_PID=$!

echo "== $NAME: $(date -u +%FT%TZ) on $(hostname), budget ${BUDGET_S}s, DRY_RUN=$DRY_RUN"
echo "== repository $ROOT, OUT=$OUT, results staged under $DEST"
echo "== GPU: ${GPU_NAME:-none} (usable by torch: $HAVE_GPU), slug $DEVICE_SLUG"

_FAILED=0
_FINISHED=0
_RUNNING=()   # the step under way: name, kind, start (SECONDS), limit

_record() {  # name kind status rc seconds limit note
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$STEPS"
}

# step NAME KIND LIMIT_S COMMAND
#   KIND gpu: needs the GPU (skipped without one, or with DRY_RUN=1); cpu (or any other kind,
#   session.sh's "part"): runs everywhere. Sets STEP_STATUS (ok, failed, timeout, skipped,
#   or cut: a step named in CUT_OK_STEPS that reached its limit; empty when ONLY_STEPS left
#   the step out) and STEP_SHORTENED (1 when the time budget left gave it less than LIMIT_S)
#   for the caller.
#   COMMAND is one string run by `bash -c` (with pipefail) under `timeout`.
step() {
  local name=$1 kind=$2 limit=$3 cmd=$4
  local log="$SESSION/logs/$name.log"
  local left=$((BUDGET_S - RESERVE_S - (SECONDS - T0)))
  STEP_STATUS=""
  STEP_SHORTENED=0
  if [ -n "${ONLY_STEPS:-}" ] && [[ " $ONLY_STEPS " != *" $name "* ]]; then
    return 0   # not selected by the caller
  fi
  [ -n "${STEP_LIMIT_S:-}" ] && limit=$STEP_LIMIT_S
  if [ "$kind" = gpu ] && { [ "$HAVE_GPU" != 1 ] || [ "$DRY_RUN" = 1 ]; }; then
    local why="no GPU"
    [ "$HAVE_GPU" = 1 ] && why="DRY_RUN=1"
    if ! bash -n -c "$cmd" 2>"$log"; then   # a skipped command is still syntax-checked
      echo "[$name] failed: the command is not valid bash: $(cat "$log")"
      _record "$name" "$kind" failed 2 0 "$limit" "syntax error (skipped: $why)"
      _FAILED=1
      STEP_STATUS=failed
      return 0
    fi
    echo "[$name] skipped: $why"
    _record "$name" "$kind" skipped "" 0 "$limit" "$why"
    STEP_STATUS=skipped
    return 0
  fi
  if [ "$left" -lt 15 ]; then
    echo "[$name] skipped: out of time budget (${left}s left of ${BUDGET_S}s)"
    _record "$name" "$kind" skipped "" 0 "$limit" "out of time budget"
    STEP_STATUS=skipped
    return 0
  fi
  if [ "$limit" -gt "$left" ]; then
    limit=$left
    STEP_SHORTENED=1   # the budget cut the step's own limit (session.sh: "partial", not "ran")
  fi
  echo "[$name] start, limit ${limit}s: $cmd"
  local t=$SECONDS rc status
  export STEP_LIMIT=$limit   # a step that must keep time for its own last writes reads it
  _RUNNING=("$name" "$kind" "$t" "$limit")   # for finish, should this script be stopped now
  # In the background, waited for: a stop signal ends `wait` at once (its trap below runs
  # finish), where a foreground pipeline would hold the trap until the step ended. With
  # pipefail the job's status is the step's own (the tee's only where the tee failed).
  timeout -k 10 "$limit" bash -o pipefail -c "$cmd" 2>&1 | tee "$log" &
  wait "$!"
  rc=$?
  _RUNNING=()
  case $rc in
    0) status=ok ;;
    124 | 137) status=timeout ;;
    *) status=failed ;;
  esac
  # A step made to run until its limit (named in CUT_OK_STEPS: memcheck takes what time is
  # left) and cut there is "cut", not a failure: what it checked is in its log.
  [ "$status" = timeout ] && [[ " ${CUT_OK_STEPS:-} " == *" $name "* ]] && status=cut
  [ "$status" = ok ] || [ "$status" = cut ] || _FAILED=1
  echo "[$name] $status (rc $rc) after $((SECONDS - t))s"
  _record "$name" "$kind" "$status" "$rc" "$((SECONDS - t))" "$limit" ""
  STEP_STATUS=$status
  return 0
}

# together NAME=COMMAND ...: run the commands at the same time (each by `bash -o pipefail -c`,
# its output in $SESSION/logs/<NAME>.log), wait for all of them, print each one's status and
# last lines, and fail if one failed. For work that may share the GPU because it times nothing
# (tests, sanitizers); the enclosing step's limit bounds them all, so each command should end
# by itself before it (a device script given BUDGET_S does). Cut at that limit, `together`
# outlives the stop signal (its commands get it too) and waits for them to write and pack what
# they have, until the limit's kill grace ends: its step must not return, and its caller
# fold and remove their folders, while they are still packing.
together() {
  local spec name i rc=0 r
  local -a pids=() names=()
  trap 'echo "[together] stop signal: waiting for ${names[*]} to write their results"' TERM INT
  for spec in "$@"; do
    name=${spec%%=*}
    bash -o pipefail -c "${spec#*=}" > "$SESSION/logs/$name.log" 2>&1 &
    pids+=("$!")
    names+=("$name")
    echo "[$name] started: ${spec#*=}"
  done
  for i in "${!pids[@]}"; do
    while :; do
      wait "${pids[$i]}"
      r=$?
      # a trapped signal ends `wait` early (status > 128) while the command still runs
      [ "$r" -gt 128 ] && kill -0 "${pids[$i]}" 2> /dev/null || break
    done
    [ "$r" = 0 ] || rc=1
    echo "[${names[$i]}] ended, rc $r; its last lines:"
    tail -n 5 "$SESSION/logs/${names[$i]}.log" | sed 's/^/    /'
  done
  trap - TERM INT
  return $rc
}

# xdist_args N: pytest's "-n N" where pytest-xdist is installed (it spreads many small tests
# over processes sharing the one GPU), nothing otherwise; $XDIST_N overrides N. Deliberately
# not "--dist loadgroup", which `make test` passes: it would put every GPU test (conftest's
# group "gpu") on one worker, and the steps' limits are sized for the spread. A GPU test that
# times something takes the least of several timings, as other workers' kernels only add time.
xdist_args() {
  if "$PY" -c "import xdist" >/dev/null 2>&1; then
    echo "-n ${XDIST_N:-$1}"
  fi
}

# Install the carried wheels (.whl/*.whl) into $SITE once per set of wheels.
install_wheels() {
  if [ "${WHEELS:-1}" = 0 ]; then
    echo "wheels: none wanted (WHEELS=0: the Python in use has what the steps need)"
    return 0
  fi
  local whls
  whls=$(ls .whl/*.whl 2>/dev/null)
  if [ -z "$whls" ]; then
    echo "no wheels in .whl/: run scripts/gpu/fetch_wheels.sh here and name .whl in carry"
    return 1
  fi
  local stamp
  stamp=$(for w in $whls; do printf '%s %s\n' "$(basename "$w")" "$(wc -c < "$w")"; done \
    | cksum | cut -d' ' -f1)
  if [ -f "$SITE/.pdt-wheels" ] && [ "$(cat "$SITE/.pdt-wheels")" = "$stamp" ]; then
    echo "wheels already installed in $SITE"
    return 0
  fi
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" $whls || return 1
  echo "$stamp" > "$SITE/.pdt-wheels"
  echo "installed into $SITE: $(for w in $whls; do basename "$w"; done | tr '\n' ' ')"
}

# Give the copy a git repository at the committed HEAD when it has none (the device receives
# files, not .git): asv needs one, and provenance records its commit. .gpu/repo.bundle and
# .gpu/commit.txt come from scripts/gpu/prepare.sh. A .git this function made carries the
# marker .git/pdt-restored and is moved to a newer commit.txt on a warm machine.
restore_git() {
  if ! command -v git >/dev/null 2>&1; then
    echo "git is not installed: commit unknown, asv cannot run"
    return 1
  fi
  local want="" have
  [ -f .gpu/commit.txt ] && want=$(cat .gpu/commit.txt)
  have=$(git rev-parse -q --verify HEAD 2>/dev/null || true)
  if [ -d .git ] && [ ! -f .git/pdt-restored ] && [ -n "$have" ]; then
    echo "git: the copy has its own .git, HEAD $have"
    [ -n "$want" ] && [ "$want" != "$have" ] && echo "git: note .gpu/commit.txt says $want"
    return 0
  fi
  if [ -n "$have" ] && [ "$have" = "$want" ]; then
    echo "git: HEAD $have (restored earlier)"
  else
    if [ ! -f .gpu/repo.bundle ]; then
      echo "no .git and no .gpu/repo.bundle: run scripts/gpu/prepare.sh here, carry .gpu"
      return 1
    fi
    [ -d .git ] || { git init -q . && touch .git/pdt-restored; } || return 1
    git config core.fileMode false
    # the bundle holds HEAD without its parents (prepare.sh): a shallow boundary there
    [ -n "$want" ] && echo "$want" > .git/shallow
    git fetch -q --no-tags .gpu/repo.bundle HEAD || return 1
    git update-ref refs/heads/main FETCH_HEAD && git symbolic-ref HEAD refs/heads/main || return 1
    git read-tree HEAD || return 1
    have=$(git rev-parse HEAD)
    echo "git: restored from .gpu/repo.bundle, HEAD $have"
  fi
  local dirty
  dirty=$(git status --porcelain --untracked-files=no -- . ':(exclude)reports' | head -20)
  if [ -n "$dirty" ]; then
    echo "git: the tree differs from HEAD (results will say dirty):"
    echo "$dirty"
  fi
  return 0
}
export -f install_wheels restore_git together

# stale_tree_refused: whether the git step found the tree differing from the commit that
# .gpu names (its log says so), and ALLOW_DIRTY=1 is not set; says what to do when it is. A
# bundle made at an older commit than the tree's would name that commit, marked dirty, on
# every result of the call: session.sh stops before its parts instead.
stale_tree_refused() {
  grep -q "^git: the tree differs from HEAD" "$SESSION/logs/git.log" 2> /dev/null || return 1
  [ "${ALLOW_DIRTY:-0}" = 1 ] && return 1
  echo "== the tree differs from the commit .gpu names ($(cat .gpu/commit.txt 2> /dev/null))," \
    "so every result would name that commit, marked dirty: commit, run scripts/gpu/prepare.sh" \
    "here and call again (ALLOW_DIRTY=1 runs anyway)"
  return 0
}

# The standard first steps: the environment report (nvidia-smi, torch, CuPy, NVRTC, tools,
# versions) with an import check of $PREFLIGHT (the project modules the later steps need; a
# failed import fails this step), then the carried wheels, then git. The report comes first so
# that it is written even where the wheels fail; on a fresh machine it therefore lists the
# carried packages (asv, mlxtend) as absent.
common_steps() {
  if [ "${COMMON_DONE:-0}" = 1 ]; then
    echo "== env, wheels, git: done by the caller on this machine (COMMON_DONE=1)"
    return 0
  fi
  if [ -n "${ENV_REPORTED:-}" ]; then   # session.sh: an earlier call on this machine did it
    echo "[env] skipped: $ENV_REPORTED"
    _record env cpu skipped "" 0 90 "$ENV_REPORTED"
  else
    ONLY_STEPS="" STEP_LIMIT_S="" step env cpu 90 "\"$PY\" scripts/gpu/env_report.py \
      --json \"$SESSION/env.json\" --import ${PREFLIGHT:-}"
  fi
  ONLY_STEPS="" STEP_LIMIT_S="" step wheels cpu 90 install_wheels
  ONLY_STEPS="" STEP_LIMIT_S="" step git cpu 60 restore_git
}

# pack_stage FILE: the staged results as a gzipped tarball. GNU tar's status 1 ("file changed
# as we read it": a stopped step still writing its last rows) still leaves a whole archive,
# of the file as it was read; only 2 and above are failures. The repository's absolute path
# on this machine ($ROOT: in logs, tracebacks and provenance) is written as <repo> in every
# staged text file first, so that results read the same wherever the copy sat.
pack_stage() {
  local rc=0
  if [ -n "${ROOT:-}" ] && [ "$ROOT" != / ]; then
    grep -rlIZF -- "$ROOT" "$STAGE" 2>/dev/null | xargs -0 -r sed -i "s|$ROOT|<repo>|g"
  fi
  tar -C "$STAGE" -czf "$1" . || rc=$?
  [ "$rc" -le 1 ]
}

finish() {
  [ "$_FINISHED" = 1 ] && return
  _FINISHED=1
  trap '' TERM INT HUP   # a second stop signal must not cut the packing short
  local code=$_FAILED
  # A step still running when this script is stopped from outside (its caller's limit) runs
  # under its own `timeout`, whose process group the caller's signal does not reach: stop it
  # (timeout passes the signal on to its command's group), so that nothing of this script
  # goes on using the GPU while the caller's next part times something.
  # Then give it a few seconds to end, so that what it writes when stopped (bench.run's and
  # bench.sdgp_semi's last rows) is packed whole: the caller kills this script 10 s after
  # stopping it.
  if command -v pkill > /dev/null && pkill -TERM -P $$ -x timeout 2> /dev/null; then
    local waited=0
    while [ "$waited" -lt 10 ] && pgrep -P $$ -x timeout > /dev/null 2>&1; do
      sleep 0.5
      waited=$((waited + 1))
    done
  fi
  if [ "${#_RUNNING[@]}" -gt 0 ]; then   # stopped from outside in mid-step: a timeout
    echo "[${_RUNNING[0]}] timeout: this script was stopped from outside during the step"
    _record "${_RUNNING[0]}" "${_RUNNING[1]}" timeout 143 "$((SECONDS - _RUNNING[2]))" \
      "${_RUNNING[3]}" "the script was stopped from outside"
    code=1
  fi
  if [ "$HAVE_GPU" != 1 ] && [ "$DRY_RUN" != 1 ]; then
    echo "== no GPU is visible and DRY_RUN is not 1: the GPU steps did not run"
    code=2
  fi
  {
    echo "# $TAG: steps"
    echo
    echo "$(date -u +%FT%TZ), host $(hostname), GPU ${GPU_NAME:-none}, DRY_RUN=$DRY_RUN," \
      "budget ${BUDGET_S}s, used $((SECONDS - T0))s, exit code $code."
    echo "Written by scripts/gpu/$NAME.sh (docs/gpu-session.md); logs in logs/."
    echo
    echo "| step | kind | status | rc | seconds | limit (s) | note |"
    echo "|---|---|---|---|---|---|---|"
    tail -n +2 "$STEPS" | awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s | %s |\n", \
      $1, $2, $3, $4, $5, $6, $7}'
    # a caller's own summary (session.sh: the steps of the scripts it ran)
    [ -f "$SESSION/status-extra.md" ] && { echo; cat "$SESSION/status-extra.md"; }
  } > "$SESSION/STATUS.md"
  cp "$WORK/console.log" "$SESSION/console.log"
  local tarball="$OUT/$TAG.tar.gz"
  # beside, then renamed: killed mid-write, the tarball an earlier merge wrote stays whole
  if pack_stage "$tarball.tmp"; then
    mv -f "$tarball.tmp" "$tarball"
  else
    rm -f "$tarball.tmp"
    code=1
  fi
  local size=0
  [ -f "$tarball" ] && size=$(wc -c < "$tarball")
  if [ "$size" -gt $((15 * 1024 * 1024)) ]; then
    split -b 15m -d -a 1 "$tarball" "$tarball.part"
    rm -f "$tarball"
    echo "== $tarball was $size bytes: split into $(ls "$tarball".part* | wc -l) parts" \
      "(cat $TAG.tar.gz.part* | tar -xz)"
  fi
  cp "$STEPS" "$OUT/$TAG-steps.tsv"
  echo "== files in $OUT (and $TAG.log, the console):"
  ls -l "$OUT" | tail -n +2
  # (a part of session.sh: the session unpacks it)
  [ -n "${PART_OF:-}" ] || echo "== unpack here with: tar -xzf <files_at>/$TAG.tar.gz -C <repository root>"
  echo "== $TAG steps (exit code $code, $((SECONDS - T0))s of ${BUDGET_S}s):"
  column -t -s $'\t' "$STEPS" 2>/dev/null || cat "$STEPS"
  [ -f "$SESSION/status-extra.md" ] && { echo; cat "$SESSION/status-extra.md"; }
  exec 1>&- 2>&-   # let the console tee drain, then keep its whole log
  wait "$_TEE_PID" 2>/dev/null
  cp "$WORK/console.log" "$OUT/$TAG.log"
  [ "${KEEP_WORK:-0}" = 1 ] || rm -rf "$WORK"
  exit "$code"
}
trap finish EXIT
# A stop from outside (the caller's `timeout`, Ctrl-C, a closed terminal) ends the script
# through its EXIT trap, `finish`, which records the step under way and packs what the steps
# that ended wrote. Left to bash's default, such a signal at times ended the script before
# the EXIT trap had run, leaving nothing.
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
