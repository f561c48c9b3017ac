#!/usr/bin/env bash
# Run HERE (not on the device) before the device calls of docs/gpu-session.md:
#   1. the wheels the device lacks -> .whl/ (scripts/gpu/fetch_wheels.sh, kept if present);
#   2. .gpu/commit.txt (HEAD) and .gpu/repo.bundle (the commit HEAD, without its history), so that the
#      device copy, which receives files but no .git, gets a repository at the same commit
#      (asv needs one; provenance records the commit; restore_git in common.sh);
#   3. checks that .whl/ and .gpu/ are ignored and that what travels (the tree git does not
#      ignore, plus the carried .whl and .gpu) stays under the 64 MiB limit.
# Commit first: results made from a tree that differs from HEAD are marked dirty.
set -euo pipefail
cd "$(dirname "$0")/../.."
LIMIT_MIB=${LIMIT_MIB:-60}   # the device's limit is 64 MiB; keep a margin

[ -n "$(ls .whl/*.whl 2>/dev/null)" ] || bash scripts/gpu/fetch_wheels.sh
mkdir -p .git/info .gpu
for pat in /.whl/ /.gpu/; do
  grep -qxF "$pat" .git/info/exclude 2>/dev/null || echo "$pat" >> .git/info/exclude
done
for d in .whl .gpu; do
  git check-ignore -q "$d/x" || { echo "prepare: $d/ is not ignored by git" >&2; exit 1; }
done

git rev-parse HEAD > .gpu/commit.txt
rm -f .gpu/repo.bundle
# shallow_bundle OUT: the commit HEAD alone, from a clone of depth 1, as a bundle at OUT (an
# absolute path). The whole history (reports committed again and again) made a bundle of over
# 20 MiB, and nothing there reads past HEAD; restore_git (common.sh) marks the commit shallow
# (.git/shallow) before it fetches, so its missing parents are not asked for.
shallow_bundle() {
  local tmp
  tmp=$(mktemp -d)
  git clone -q --depth 1 --no-tags "file://$PWD" "$tmp/r" \
    && [ "$(git -C "$tmp/r" rev-parse HEAD)" = "$(git rev-parse HEAD)" ] \
    && git -C "$tmp/r" bundle create -q "$1" HEAD
  local rc=$?
  rm -rf "$tmp"
  [ "$rc" -eq 0 ] || echo "prepare: no shallow bundle of HEAD (is HEAD a branch?)" >&2
  return $rc
}
shallow_bundle "$PWD/.gpu/repo.bundle"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "prepare: WARNING: tracked files differ from HEAD; commit them, or the results say dirty"
fi

# (a tracked file deleted in the work tree is listed but has no size: `|| true`, or stat's
# failure would end the script here under pipefail, before the size check)
tree=$({ git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null || true; } \
  | awk '{s += $1} END {print s + 0}')
whl=$(du -cb .whl/*.whl | tail -1 | cut -f1)
gpu=$(du -cb .gpu/* | tail -1 | cut -f1)
total=$((tree + whl + gpu))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "prepare: HEAD $(cat .gpu/commit.txt)"
echo "prepare: travels: tree $(mib "$tree") MiB + .whl $(mib "$whl") MiB + .gpu $(mib "$gpu")" \
  "MiB = $(mib "$total") MiB (device limit 64 MiB)"
echo "prepare: each run call: carry=[\".whl\", \".gpu\"]"
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "prepare: over ${LIMIT_MIB} MiB: ignore or remove large untracked files" >&2
  exit 1
fi
