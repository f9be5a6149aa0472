#!/usr/bin/env bash
# On a machine with network: build the preflight wheel and fetch the wheels a
# GPU node's image lacks, for that node's Python, into .whl/ (git-ignored).
# tests/gpu/run.sh installs them there with --no-deps, without network.
#
#   tests/gpu/prepare.sh                      # for Python 3.12 on x86-64 (the default)
#   PY_VERSION=3.11 tests/gpu/prepare.sh      # for another Python
#   WHEEL_DIR=/tmp/w tests/gpu/prepare.sh     # somewhere else
#
# The image is assumed to hold torch, typer, rich, psutil, prometheus-client and
# nvidia-ml-py (preflight's other needs) but not pydantic: pydantic and
# pydantic-settings come with what they need (pydantic-core, annotated-types,
# typing-extensions, typing-inspection, python-dotenv). The version ranges are
# pyproject.toml's.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PY_VERSION:-3.12}
dir=${WHEEL_DIR:-.whl}
mkdir -p "$dir"
rm -f "$dir"/*.whl  # one version of each: two of a package stop the install

python3 -m pip wheel -q --no-deps -w "$dir" .

needs=('pydantic>=2.6,<3' 'pydantic-settings>=2.7')
case "$py" in 3.[0-9] | 3.10) needs+=('tomli>=2') ;; esac  # tomllib is in the standard library from 3.11
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --only-binary=:all: --python-version "$py" --implementation cp "${platforms[@]}" \
  -d "$dir" "${needs[@]}"

echo "wheels in $dir for Python $py:"
ls -1 "$dir"
du -sh "$dir" | cut -f1
