#!/usr/bin/env bash
# Download into .whl/ the wheels the GPU machine lacks (scripts/gpu/wheels.txt), for CPython
# 3.12 on manylinux x86_64, as the GPU machine's notes describe; run it HERE (the
# machine with a package registry), never on the device. Re-running keeps wheels already there.
#
#   bash scripts/gpu/fetch_wheels.sh            # -> .whl/*.whl, prints the total size
#
# Also makes sure .whl/ (and .gpu/, see prepare.sh) are ignored through .git/info/exclude, so
# that they travel to the device only when a `run` call names them in `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PIP_PYTHON:-python3}
DEST=${WHEEL_DIR:-.whl}
LIST=scripts/gpu/wheels.txt

mkdir -p .git/info "$DEST"
for pat in /.whl/ /.gpu/; do
  grep -qxF "$pat" .git/info/exclude 2>/dev/null || echo "$pat" >> .git/info/exclude
done

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64 manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 \
         manylinux_2_35_x86_64; do
  platforms+=(--platform "$p")
done

grep -v '^\s*#' "$LIST" | grep -v '^\s*$' | while read -r req; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$DEST" "$req"
done

# One version per package: two wheels of one name would stop the install on the device.
dups=$(for w in "$DEST"/*.whl; do basename "$w"; done | cut -d- -f1 | tr 'A-Z_' 'a-z-' \
  | sort | uniq -d)
if [ -n "$dups" ]; then
  echo "fetch_wheels: several versions of: $dups (remove the stale ones from $DEST)" >&2
  exit 1
fi
echo "fetch_wheels: $(ls "$DEST"/*.whl | wc -l) wheels in $DEST:"
ls -l "$DEST"/*.whl | awk '{printf "  %8d  %s\n", $5, $NF}'
echo "fetch_wheels: total $(du -cb "$DEST"/*.whl | tail -1 | cut -f1) bytes"
