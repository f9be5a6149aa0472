#!/usr/bin/env bash
# shellcheck disable=SC2329  # the do_* functions are called through step, by name
# The GPU acceptance kit: a first contact with a GPU node in one run of at most
# 8 minutes (the device call's limit is 10), without network. From a copy of
# the repository with the .whl/ that tests/gpu/prepare.sh made:
#
#   bash tests/gpu/run.sh                              # results in a fresh mktemp -d, printed
#   STEPS='captures reference' bash tests/gpu/run.sh    # some steps only
#
# It runs as root: OUT (where results go, and are read back from) must be a new or
# empty directory of the running user's that no one else can write to, and SITE_DIR
# (first on every child's PYTHONPATH; by default a fresh mktemp -d, removed at the
# end) one of the user's that no one else can write to; either is refused otherwise,
# exit 2, before anything is written or imported.
#
# Steps, each under its own budget (kill grace included) and each run whatever
# the one before did:
#   setup      install the wheels with --no-deps beside the image's packages; version, nvidia-smi -L
#   captures   the node as its tools print it, bytes untouched (cmd > file), in $OUT/captures/
#   reference  a plain torch loop (tests/gpu/reference.py): HBM copy, H2D, D2H, bf16 GEMM
#   verdict    tests/perf/bench_time_to_verdict.py: a bare torchrun (tests/gpu/bare.py: torch import,
#              NCCL group, one all_reduce), the quick and the standard level (--keep-going), interleaved,
#              twice, with each check's share
#   full       the full level's burnin and memtest, shortened by a site profile (45 s, 30 s)
#   generic    the standard level under --profile generic: what a GPU model no profile names gets
#   pytest     pytest -m gpu
#   summary    tests/gpu/kit.py summary: times, ratios to the plain loop, the acceptance
# Results in $OUT (default: a fresh /tmp/preflight-gpu.XXXXXX, 0700): kit.log (all of it), steps.tsv, captures/, reference.json,
# verdict.json, quick.json, standard.json, full.json, generic.json (+ .log), pytest-gpu.log, acceptance.json.
#
# Exit: the summary's (0: PASS at every level with no WARN), else 1.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 3
repo=$PWD
dir=${WHEEL_DIR:-$repo/.whl}  # absolute: the steps run from a scratch directory of their own
me=$(id -u)

# unsafe PATH: why PATH, as far as it exists, is no place for this run (root, on a node)
# to write to or import from; nothing when it is. Each directory on the way must be
# root's or this user's and, where others may write to it, sticky (as /tmp is), else
# another user could swap what comes below it; a link on the way must be root's or
# this user's; the directory itself, this user's, no link, and written by no one else.
unsafe() {
  local path=$1 at="" part uid mode kind
  local -a parts
  IFS=/ read -ra parts <<< "${path#/}"
  for part in "${parts[@]}"; do
    [ -n "$part" ] || continue
    at=$at/$part
    [ -e "$at" ] || [ -L "$at" ] || return 0
    read -r uid mode kind < <(stat -c '%u %a %F' -- "$at")
    if [ "$uid" != 0 ] && [ "$uid" != "$me" ]; then
      echo "$at belongs to uid $uid"
      return 0
    fi
    if [ "$at" = "$path" ]; then
      [ "$kind" = directory ] || { echo "$at is a $kind, not a directory"; return 0; }
      [ "$uid" = "$me" ] || { echo "$at belongs to uid $uid, not to this user ($me)"; return 0; }
      (( 8#$mode & 8#022 )) && { echo "$at can be written by others (mode $mode)"; return 0; }
    elif [ "$kind" = directory ] && (( 8#$mode & 8#022 )) && ! (( 8#$mode & 8#1000 )); then
      echo "$at can be written by others and is not sticky (mode $mode)"
      return 0
    fi
  done
}

# private_dir NAME PATH EMPTY: PATH made absolute, checked, and made (0700) where it is not
# there; with EMPTY=1 it must be empty, as a result planted in it would be read back as
# this run's. The path is printed; a refusal is one line on stderr, and status 2.
private_dir() {
  local name=$1 path=$2 empty=$3 why
  case "$path" in /*) ;; *) path=$PWD/$path ;; esac
  path=$(printf '%s' "$path" | sed -e 's#//*#/#g' -e 's#\(.\)/$#\1#')
  why=$(unsafe "$path")
  if [ -z "$why" ] && [ ! -e "$path" ] && [ ! -L "$path" ]; then
    mkdir -p -- "$(dirname -- "$path")" && mkdir -m 0700 -- "$path" || why="cannot make $path"
    [ -n "$why" ] || why=$(unsafe "$path")  # what was made on the way: as safe now as it was checked
  elif [ -z "$why" ] && [ "$empty" = 1 ] && [ -n "$(ls -A -- "$path")" ]; then
    why="$path is not empty"
  fi
  if [ -n "$why" ]; then
    echo "run.sh: refusing $name=$2: $why (leave $name unset for a fresh directory of mktemp's)" >&2
    return 2
  fi
  printf '%s\n' "$path"
}

# Wheels root installs: a WHEEL_DIR given must be as safe as SITE_DIR (the default, .whl/ in this checkout, is).
if [ -n "${WHEEL_DIR:-}" ]; then
  case "$dir" in /*) ;; *) dir=$PWD/$dir ;; esac
  dir=$(printf '%s' "$dir" | sed -e 's#//*#/#g' -e 's#\(.\)/$#\1#')  # as private_dir does: unsafe compares whole paths
  why=$(unsafe "$dir")
  # One not there yet could be made by another user (under /tmp) before the setup step reads it.
  [ -n "$why" ] || [ -d "$dir" ] || why="$dir is not a directory"
  if [ -n "$why" ]; then
    echo "run.sh: refusing WHEEL_DIR=$WHEEL_DIR: $why (leave WHEEL_DIR unset for the checkout's .whl/)" >&2
    exit 2
  fi
fi

# Both on PYTHONPATH or written to by root: this user's own, or fresh from mktemp (0700).
# A fresh site is removed at the end; SITE_DIR keeps the install for a later run.
if [ -n "${SITE_DIR:-}" ]; then
  site=$(private_dir SITE_DIR "$SITE_DIR" 0) || exit 2
else
  site=$(mktemp -d /tmp/preflight-site.XXXXXX) || exit 3
  trap 'rm -rf -- "$site"' EXIT
fi
if [ -n "${OUT:-}" ]; then
  out=$(private_dir OUT "$OUT" 1) || exit 2
else
  out=$(mktemp -d /tmp/preflight-gpu.XXXXXX) || exit 3
fi
mkdir "$out/captures" || exit 3
steps=" ${STEPS:-setup captures reference verdict full generic pytest} summary "

# Seconds each step may take, its children's kill grace included: they add up to
# at most 480 (tests/gpu/test_kit.py holds them to it), so the whole kit ends
# within 8 minutes whatever hangs.
B_SETUP=20
B_CAPTURES=35
# The plain loop took 15 s on the H200 (2026-11-27, call 5).
B_REFERENCE=35
# Two rounds of a bare torchrun, standard and quick: 112 s on the H200 before issue 34 (10.9 + 41.0 + 3.5 s a round),
# 59-76 s on an H200 after it (2026-11-27: 8-10 + 17-24 + 1.3-2.3 s a round), plus two torch imports (the GPU
# count, the quick level's import probe); a round that would not fit is not started.
B_VERDICT=130
# 45 s of burn-in and 30 s of memtest, each a launch of its own: 67 s on the H200 (call 5).
B_FULL=95
# One standard run: 15-18 s on the H200 after issue 34 (a bare torchrun's 8 s, then the checks).
B_GENERIC=35
# pytest -m gpu: twelve tests, six of them a launch of ranks each (torchrun and a torch import, ~9 s on the H200):
# 87 s there (2026-11-27), collection included (pyproject's norecursedirs keeps it out of the recorded sysfs trees).
B_PYTEST=110
B_SUMMARY=10

exec > >(tee -a "$out/kit.log") 2>&1
echo "run.sh: budgets (s): setup $B_SETUP, captures $B_CAPTURES, reference $B_REFERENCE, verdict $B_VERDICT," \
  "full $B_FULL, generic $B_GENERIC, pytest $B_PYTEST, summary $B_SUMMARY;" \
  "total $((B_SETUP + B_CAPTURES + B_REFERENCE + B_VERDICT + B_FULL + B_GENERIC + B_PYTEST + B_SUMMARY))"
: > "$out/steps.tsv"

# within SECONDS CMD...: CMD under a deadline; SIGTERM at SECONDS - 2, SIGKILL 2 s later.
within() {
  local s=$1
  shift
  timeout -k 2 "$((s > 3 ? s - 2 : 1))" "$@"
}

# step NAME BUDGET FUNCTION: run the step's function if chosen, record its seconds and exit code.
step() {
  local name=$1 budget=$2 fn=$3 t0 t1 rc
  case "$steps" in *" $name "*) ;; *) return 0 ;; esac
  echo "== $name (budget $budget s) $(date -u +%H:%M:%S)"
  t0=$(date +%s%N)
  "$fn" "$budget"
  rc=$?
  t1=$(date +%s%N)
  printf '%s\t%s\t%s\t%s\n' "$name" "$budget" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')" "$rc" >> "$out/steps.tsv"
  echo "== $name: exit $rc"
}

# cap NAME SECONDS CMD...: the command's stdout into captures/NAME, byte for byte; its stderr and
# exit code beside it. A tool the node lacks is said, not failed.
cap() {
  local name=$1 s=$2
  shift 2
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "$name: $1 not found" >> "$out/captures/INDEX.txt"
    return 0
  fi
  within "$s" "$@" > "$out/captures/$name" 2> "$out/captures/$name.stderr"
  echo "$name: exit $? ($*)" >> "$out/captures/INDEX.txt"
}

do_setup() {
  if ls "$dir"/*.whl >/dev/null 2>&1; then
    # Compiled, as pip installs by default: an image that forbids writing bytecode
    # (PYTHONDONTWRITEBYTECODE) otherwise compiles preflight and pydantic on every run,
    # 0.6 s of the quick level's 1.9 s on the H200.
    within 14 python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$site" "$dir"/*.whl || return 3
  else
    echo "run.sh: no wheels in $dir (tests/gpu/prepare.sh makes them where there is network): using the preflight already installed"
  fi
  within 3 python3 -m preflight version
  within 3 nvidia-smi -L || echo "run.sh: nvidia-smi did not answer"
}

# Each cap's seconds include its kill grace; they add up to B_CAPTURES at most.
do_captures() {
  : > "$out/captures/INDEX.txt"
  cap nvidia-smi-q.txt 10 nvidia-smi -q
  cap nvidia-smi-topo-m.txt 4 nvidia-smi topo -m
  cap nvidia-smi-q-d-performance-clock-power.txt 5 nvidia-smi -q -d PERFORMANCE,CLOCK,POWER
  cap lspci-vvv.txt 4 lspci -vvv
  cap dmesg-tail.txt 3 sh -c 'dmesg | tail -n 300'
  cap df-dev-shm.txt 3 df -B1 /dev/shm
  cap mount-dev-shm.txt 3 sh -c 'grep " /dev/shm " /proc/self/mountinfo; mount | grep " /dev/shm "'
  cap numactl-H.txt 3 numactl -H
  cat "$out/captures/INDEX.txt"
}

do_reference() {
  # shellcheck disable=SC2086  # REFERENCE_ARGS is split on purpose
  within "$1" python3 "$repo/tests/gpu/reference.py" --out "$out/reference.json" ${REFERENCE_ARGS:-}
}

# The bench stops starting rounds 8 s before the step's end, so its own figures are written;
# it leaves the last round's reports as quick.json and standard.json (+ .log) for the summary.
do_verdict() {
  within "$1" python3 "$repo/tests/perf/bench_time_to_verdict.py" "${VERDICT_ROUNDS:-2}" --budget "$(($1 - 8))" --profile "${PROFILE:-auto}" \
    --out "$out/verdict.json" --keep "$out"
}

# A site profile of the same name replaces the built-in one (PREFLIGHT_PROFILES_DIR): the
# detected profile, copied with [burnin] seconds = 45 and [memtest] seconds = 30.
do_full() {
  local name builtin profiles
  name=${PROFILE:-$(within 10 python3 -m preflight detect --json 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin).get("profile") or "")' 2>/dev/null)}
  builtin=$(python3 -c 'import sys, preflight.pipeline as p; from pathlib import Path; print(Path(p.__file__).parent / "profiles" / (sys.argv[1] + ".toml"))' "$name" 2>/dev/null)
  if [ -z "$name" ] || [ ! -f "$builtin" ]; then
    echo "run.sh: no profile detected ('$name'): the full level is not run"
    return 2
  fi
  profiles=$(mktemp -d /tmp/preflight-site-profiles.XXXXXX)
  python3 "$repo/tests/gpu/kit.py" site-profile "$builtin" "$profiles/$name.toml" --burnin 45 --memtest 30 || return 2
  cp "$profiles/$name.toml" "$out/site-profile-$name.toml"
  PREFLIGHT_PROFILES_DIR=$profiles within "$(($1 - 14))" python3 -m preflight run --profile "$name" --level full --only burnin,memtest \
    --keep-going --json --scratch > "$out/full.json" 2> "$out/full.log"
}

# Every model no profile names runs under generic (the report's profile_chosen_because says so):
# on a model that has a profile, generic's own judgement of a healthy node is seen here too.
do_generic() {
  within "$1" python3 -m preflight run --profile generic --level standard --keep-going --json --scratch \
    > "$out/generic.json" 2> "$out/generic.log"
}

do_pytest() {
  python3 -c 'import pytest' 2>/dev/null || { echo "run.sh: pytest is not installed here"; return 5; }
  within "$1" python3 -m pytest -c "$repo/pyproject.toml" --rootdir "$repo" -m gpu -q -rA -p no:cacheprovider \
    --continue-on-collection-errors "$repo/tests" > "$out/pytest-gpu.log" 2>&1
  local rc=$?
  tail -15 "$out/pytest-gpu.log"
  return "$rc"
}

do_summary() {
  within "$1" python3 "$repo/tests/gpu/kit.py" summary "$out"
}

export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# From an empty folder: `python3 -m preflight`, here and in every child, must import the
# installed wheel, not ./preflight (the source tree lacks preflight.checks, which the
# wheel maps from checks/). PYTHONSAFEPATH would do it too, but it also keeps the
# workers, which run by path, from importing their sibling _rank.py.
work=$(mktemp -d /tmp/preflight-gpu-cwd.XXXXXX)
cd "$work" || exit 3

step setup "$B_SETUP" do_setup
step captures "$B_CAPTURES" do_captures
step reference "$B_REFERENCE" do_reference
step verdict "$B_VERDICT" do_verdict
step full "$B_FULL" do_full
step generic "$B_GENERIC" do_generic
step pytest "$B_PYTEST" do_pytest
step summary "$B_SUMMARY" do_summary
rc=$(awk -F'\t' '$1 == "summary" { print $4 }' "$out/steps.tsv")
echo "run.sh: results in $out"
exit "${rc:-1}"
