#!/bin/bash
# The shipped units under a real systemd, on a machine where systemd is not PID 1
# (a container, a CI VM): systemd boots as PID 1 of its own PID, mount and network
# namespaces, with the units from systemd/, a stand-in job launcher behind the
# drop-in, and preflight installed as docs/boot-gate.md says.
# It then checks what a person would: the gate passes and the launcher starts
# after it; the hardened exporter (DynamicUser, MemoryDenyWriteExecute, syscall
# filter) serves the report; the recheck (quick) keeps the gate's nccl, bandwidth and train;
# a failing gate stops the launcher and the recheck refuses to run; a stop in the
# middle of a run is recorded and leaves no process behind.
#
# Usage, as root, from the repository root (about 3 minutes on 2 vCPUs):
#   tests/manual/systemd_boot.sh [TRAINING_PYTHON]
# TRAINING_PYTHON runs the GPU workers (config `python`); default: .venv/bin/python.
#
# Safety: systemd's early boot empties /tmp (tmpfiles "D /tmp") and writes /var/log,
# /var/lib and /etc. Here each of those is a tmpfs inside the namespace, and the
# early-boot units that touch the kernel (sysctl, modules, udev) or /etc (sysusers,
# firstboot) are masked. The only mark on the host is /opt/preflight-boot-test
# and /opt/preflight-boot-work.* (the install and the unit files, removed at the
# end) and an empty /etc/preflight while it runs.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TRAIN_PY=${1:-$ROOT/.venv/bin/python}
[ "$(id -u)" = 0 ] || { echo "run as root (namespaces, mounts, systemd)" >&2; exit 2; }
[ -x "$TRAIN_PY" ] || { echo "no training interpreter at $TRAIN_PY: give one with torch" >&2; exit 2; }
# Where systemd is PID 1, install the units for real; this script would share its cgroups.
[ "$(cat /proc/1/comm)" != systemd ] || { echo "systemd is PID 1 here: copy the units into /etc/systemd/system instead" >&2; exit 2; }
OPT=/opt/preflight-boot-test  # outside /root and /home: the exporter runs with ProtectHome=yes
WORK=$(mktemp -d /opt/preflight-boot-work.XXXXXX)  # not under /tmp, /var or /run: those are tmpfs inside
SYSTEMD_PID=""

cleanup() {
    set +e  # tear down as much as there is, whatever failed
    [ -n "$SYSTEMD_PID" ] && kill -KILL "$SYSTEMD_PID" 2>/dev/null  # PID 1 of its namespace: everything in it dies too
    sleep 1
    [ -d /etc/preflight ] && [ -z "$(ls -A /etc/preflight 2>/dev/null)" ] && [ -e "$WORK/made-etc-preflight" ] && rmdir /etc/preflight
    for h in /sys/fs/cgroup/*/; do  # the empty cgroups it made in the shared hierarchy
        for d in init.scope system.slice; do [ -d "$h$d" ] && find "$h$d" -depth -type d -exec rmdir {} \; 2>/dev/null; done
    done
    rm -rf "$WORK" "$OPT"
}
trap cleanup EXIT

echo "== install (docs/boot-gate.md step 1) into $OPT"
/usr/bin/python3 -m venv "$OPT" && "$OPT/bin/pip" install -q "$ROOT" >/dev/null 2>&1  # the system python: a venv links to its base, which must be outside /root and /home too

echo "== units"
mkdir -p "$WORK/units/job-launcher.service.d"
cp "$ROOT"/systemd/preflight.service "$ROOT"/systemd/preflight-recheck.service "$ROOT"/systemd/preflight-recheck.timer \
   "$ROOT"/systemd/preflight-exporter.service "$WORK/units/"
cp "$ROOT/systemd/drop-ins/job-launcher.service.d/preflight.conf" "$WORK/units/job-launcher.service.d/"
printf '[Unit]\nDescription=stand-in job launcher\n[Service]\nExecStart=/bin/sleep infinity\n' > "$WORK/units/job-launcher.service"
printf '[Unit]\nDescription=preflight boot test\nWants=preflight.service job-launcher.service preflight-exporter.service preflight-recheck.timer\n' \
    > "$WORK/units/preflight-boot-test.target"
config() { printf 'profile = "%s"\npython = "%s"\n' "$1" "$TRAIN_PY"; }
config cpu > "$WORK/config.toml"

cat > "$WORK/boot.sh" <<EOF
#!/bin/bash
set -e
mount --make-rprivate /
for d in /run /tmp /var/tmp /var/log /var/lib /etc/systemd/system /usr/local/bin; do mount -t tmpfs tmpfs "\$d"; done
mkdir -p /run/lock /etc/preflight && mount -t tmpfs tmpfs /etc/preflight
cp -r "$WORK/units/." /etc/systemd/system/
for u in \$(ls /lib/systemd/system/sysinit.target.wants/) tmp.mount systemd-udevd.service systemd-udev-trigger.service \
         systemd-remount-fs.service systemd-timesyncd.service ldconfig.service systemd-hwdb-update.service; do
    [ "\$u" = systemd-journald.service ] || ln -sf /dev/null "/etc/systemd/system/\$u"
done
ln -s "$OPT/bin/preflight" /usr/local/bin/preflight   # the path the units use
cp "$WORK/config.toml" /etc/preflight/config.toml
ip link set lo up
exec env container=preflight-boot-test /lib/systemd/systemd --system --unit=preflight-boot-test.target
EOF
chmod +x "$WORK/boot.sh"
[ -d /etc/preflight ] || { mkdir /etc/preflight; touch "$WORK/made-etc-preflight"; }

echo "== boot"
setsid timeout 900 unshare --pid --fork --mount --net --uts --ipc --mount-proc "$WORK/boot.sh" > "$WORK/console.log" 2>&1 < /dev/null &
for _ in $(seq 50); do
    SYSTEMD_PID=$(pgrep -f "^/lib/systemd/systemd --system --unit=preflight-boot-test.target" | head -1) && [ -n "$SYSTEMD_PID" ] && break
    sleep 0.2
done
[ -n "$SYSTEMD_PID" ] || { echo "systemd did not start:"; cat "$WORK/console.log"; exit 1; }
inside() { nsenter -t "$SYSTEMD_PID" -a "$@"; }
for _ in $(seq 300); do  # until the gate has run: "" while systemd starts, then inactive (queued), activating
    case "$(inside systemctl is-active preflight.service 2>/dev/null || true)" in active | failed) break ;; esac
    sleep 1
done

failures=0
expect() {  # expect WHAT ACTUAL WANTED
    if [ "$2" = "$3" ]; then echo "ok   $1: $2"; else echo "FAIL $1: $2, wanted $3"; failures=$((failures + 1)); fi
}
metric() { inside curl -s 127.0.0.1:9842/metrics | awk -v n="$1" '$1 == n {print $2}'; }

echo "== the gate passes; the launcher starts after it"
expect "preflight.service" "$(inside systemctl is-active preflight.service)" active
expect "job-launcher.service" "$(inside systemctl is-active job-launcher.service)" active
inside journalctl -u preflight.service -o cat | tail -1
expect "exporter" "$(inside systemctl is-active preflight-exporter.service)" active
expect "exporter user" "$(inside systemctl show -p User --value preflight-exporter.service)" preflight-exporter
expect "preflight_run_passed" "$(metric preflight_run_passed)" 1.0
expect "preflight_vouched" "$(metric preflight_vouched)" 1.0
expect "preflight status" "$(inside preflight status >/dev/null 2>&1; echo $?)" 0
expect "textfile" "$(inside stat -c %a /var/lib/preflight/textfile/preflight.prom)" 644

echo "== the recheck (quick) keeps the gate's nccl, bandwidth and train"
inside systemctl start preflight-recheck.service
expect "recheck" "$(inside systemctl show -p Result --value preflight-recheck.service)" success
expect "carried" "$(inside python3 -c 'import json; print(sum("carried_from" in c["details"] for c in json.load(open("/var/lib/preflight/report.json"))["checks"]))')" 3

echo "== a failing gate holds the launcher back; the recheck refuses to run"
config h100-sxm | inside tee /etc/preflight/config.toml >/dev/null  # no GPU here: cuda FAILs
inside systemctl restart preflight.service 2>/dev/null || true
expect "preflight.service" "$(inside systemctl is-active preflight.service)" failed
expect "job-launcher.service" "$(inside systemctl is-active job-launcher.service)" inactive
expect "recheck" "$(inside systemctl start preflight-recheck.service 2>/dev/null; echo $?)" 1
expect "preflight_run_passed" "$(metric preflight_run_passed)" 0.0
expect "preflight status --npd" "$(inside preflight status --npd >/dev/null 2>&1; echo $?)" 1

echo "== fixed: the gate passes again and the launcher starts"
config cpu | inside tee /etc/preflight/config.toml >/dev/null
inside systemctl restart preflight.service && inside systemctl start job-launcher.service
expect "job-launcher.service" "$(inside systemctl is-active job-launcher.service)" active

echo "== a stop in the middle of a run"
inside systemctl restart --no-block preflight.service
sleep 12
inside systemctl stop preflight.service
expect "interrupted_by_signal" "$(inside python3 -c 'import json; print(json.load(open("/var/lib/preflight/report.json"))["interrupted_by_signal"])')" 15
expect "workers left" "$(inside pgrep -fc 'torchrun|preflight-worker' || true)" 0
expect "job-launcher.service" "$(inside systemctl is-active job-launcher.service)" inactive

if [ "$failures" != 0 ]; then
    echo "== the journal of each unit"
    for u in preflight.service preflight-exporter.service preflight-recheck.service job-launcher.service; do
        inside journalctl -u "$u" -o short-monotonic --no-pager | tail -40
    done
fi
echo "== $failures failed"
[ "$failures" = 0 ]
