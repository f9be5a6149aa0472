#!/usr/bin/env bash
# On the GPU node, from a copy of the repository with the .whl/ that
# tests/gpu/prepare.sh made (no network needed): install the wheels with
# --no-deps beside the image's own packages, then run the acceptance kit
# (`preflight selftest`) and the tests marked gpu. Results go to $OUT
# (selftest.json, selftest.log, pytest-gpu.log).
#
#   OUT=/tmp/out bash tests/gpu/run.sh
#   SELFTEST_ARGS='--stage nccl' bash tests/gpu/run.sh    # other selftest options
#   PYTEST_SECONDS=0 bash tests/gpu/run.sh                # no pytest
#   FULL=1 bash tests/gpu/run.sh                          # burnin and memtest alone (full.json, full.log)
#
# Exit: selftest's code (0 pass, 1 a stage failed or was skipped), else pytest's.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${WHEEL_DIR:-.whl}
site=${SITE_DIR:-/tmp/site}
out=${OUT:-$(mktemp -d /tmp/preflight-gpu.XXXXXX)}
mkdir -p "$out"
budget=${SELFTEST_BUDGET:-360}        # seconds; with pytest's 150, run.sh stays within 10 minutes
pytest_seconds=${PYTEST_SECONDS:-150}

ls "$dir"/*.whl >/dev/null 2>&1 || { echo "run.sh: no wheels in $dir: run tests/gpu/prepare.sh first, where there is network" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$dir"/*.whl || exit 3
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Everything runs from an empty folder: `python3 -m preflight`, here and in every
# child the tests start, must import the installed wheel, not ./preflight (the
# source tree lacks preflight.checks, which the wheel maps from checks/).
# PYTHONSAFEPATH would do it too, but it also keeps the workers, which run by
# path, from importing their sibling _rank.py.
repo=$PWD
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/preflight-gpu-cwd.XXXXXX)
cd "$work" || exit 3

python3 -m preflight version
timeout 30 nvidia-smi -L || echo "run.sh: nvidia-smi did not answer"

# FULL=1: the full level's long checks alone (burn-in 300 s, memory test up to 120 s), in place
# of the selftest and pytest, so the call stays within the device's 10 minutes.
if [ "${FULL:-0}" = 1 ]; then
  timeout -k 10 560 python3 -m preflight run --profile "${PROFILE:-auto}" --level full --only burnin,memtest --keep-going \
    --scratch --json > "$out/full.json" 2> "$out/full.log"
  frc=$?
  tail -40 "$out/full.log"
  echo "run.sh: full level (burnin, memtest) exit $frc; results in $out/full.json"
  exit "$frc"
fi

# shellcheck disable=SC2086  # SELFTEST_ARGS is split on purpose
timeout -k 10 $((budget + 60)) python3 -m preflight selftest ${SELFTEST_ARGS:---strict} --budget "$budget" \
  --out "$out/selftest.json" 2>&1 | tee "$out/selftest.log"
rc=${PIPESTATUS[0]}

prc=0
if [ "$pytest_seconds" -gt 0 ] && python3 -c 'import pytest' 2>/dev/null; then
  timeout -k 10 "$pytest_seconds" python3 -m pytest -c "$repo/pyproject.toml" --rootdir "$repo" -m gpu -q -rA \
    -p no:cacheprovider --continue-on-collection-errors "$repo/tests" \
    2>&1 | tee "$out/pytest-gpu.log"
  prc=${PIPESTATUS[0]}
else
  echo "run.sh: pytest not run (not installed here, or PYTEST_SECONDS=0)"
fi
echo "run.sh: selftest exit $rc, pytest exit $prc; results in $out"
[ "$rc" -ne 0 ] && exit "$rc"
exit "$prc"
