"""NCCL's settings as NCCL itself sees them: the environment, then the
user's config file, then /etc/nccl.conf.

NCCL loads NCCL_CONF_FILE (else ~/.nccl.conf) and then /etc/nccl.conf without
overwriting what is already set, so the environment wins, then the user's
file, then the system's (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
"""

from __future__ import annotations

import os
import pwd
import re

from preflight.base.host import Host
from preflight.readers import capture

ENVIRONMENT = "the environment"
CONF_LIMIT = 1 << 20  # bytes read of a config file: NCCL's are a few lines

# NCCL_P2P_LEVEL's words, nearest first, as NCCL orders its path types (topoPathTypeStr up to
# PATH_SYS; NVB, C2C, PXN and P2C only in newer versions): NCCL uses P2P between two GPUs whose
# path is this level or nearer. SYS, the widest, reaches across the SMP interconnect between NUMA
# nodes: it cuts nothing. NCCL matches the word exactly (strcmp), and takes the old numbers 0-4+.
P2P_LEVELS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS")
P2P_OLD_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")  # ncclGetLevel's levelsOldToNew; 4 and up: SYS


def p2p_level(value: str) -> str | None:
    """The level NCCL reads from an NCCL_P2P_LEVEL value; None where NCCL ignores it (its default then).
    As NCCL compares it (ncclGetLevel): the word exactly, else a number where the value starts with a digit."""
    if value in P2P_LEVELS:
        return value
    if value[:1].isdigit():  # NCCL reads the leading number (strtol)
        return P2P_OLD_LEVELS[min(int(re.match(r"[0-9]+", value).group()), len(P2P_OLD_LEVELS) - 1)]  # type: ignore[union-attr]
    return None


def p2p_cuts(level: str | None, kind: str) -> bool:
    """Whether a P2P level cuts a pair at ``kind`` (a P2P_LEVELS word)."""
    return level is not None and P2P_LEVELS.index(kind) > P2P_LEVELS.index(level)


_STRTOL = re.compile(r"[ \t\n\v\f\r]*([+-]?)(0[xX](?=[0-9a-fA-F])|0|)([0-9a-fA-F]*)")


def nccl_int(value: str) -> int:
    """An integer setting as NCCL reads it: strtol(value, NULL, 0) (ncclLoadParam, ncclGetLevel):
    leading space skipped, 0x for hex, a leading 0 for octal, the digits up to the first other
    character, 0 where there are none. "1 # debugging" is 1, "0 # keep it on" is 0, "yes" is 0."""
    sign, base_mark, digits = _STRTOL.match(value).groups()  # type: ignore[union-attr]
    base = 16 if base_mark[:2].lower() == "0x" else 8 if base_mark == "0" else 10
    valid = "0123456789abcdef"[:base]
    taken = ""
    for c in digits.lower():
        if c not in valid:
            break
        taken += c
    number = int(taken, base) if taken else 0
    return -number if sign == "-" else number


# Debugging switches that cost real speed when left set: name -> (is it on, as NCCL reads it?, what it costs).
# SHM and P2P turn off only at exactly 1 (ncclParamShmDisable() == 1; ncclGetLevel's disable == 1), IB at any other than 0.
SWITCHES = {
    "NCCL_SHM_DISABLE": (lambda v: nccl_int(v) == 1, "turns off NCCL's shared-memory transport: GPUs without P2P fall back to sockets, which made one real job's NCCL 14x slower"),
    "NCCL_P2P_DISABLE": (lambda v: nccl_int(v) == 1, "turns off P2P over NVLink and PCIe: GPU-to-GPU traffic is staged through host memory at a fraction of NVLink's bandwidth"),
    "NCCL_IB_DISABLE": (lambda v: nccl_int(v) != 0, "turns off InfiniBand/RoCE: traffic between nodes falls back to TCP sockets, an order of magnitude slower"),
    # SYS (or an old 4 and up) allows every path, and a word NCCL does not know leaves its default: neither cuts anything.
    "NCCL_P2P_LEVEL": (lambda v: p2p_cuts(p2p_level(v), "SYS"),
                       "caps the distance at which NCCL uses P2P: GPU pairs beyond it go through host memory (LOC or 0 turns P2P off)"),
}


def conf_files(host: Host) -> list[str]:
    """NCCL_CONF_FILE, else ~/.nccl.conf of the user NCCL runs as, then /etc/nccl.conf. The home
    directory is the password database's, as NCCL finds it (getpwuid), not $HOME: root started
    with another user's HOME (`sudo -E`, `su -m`) reads no file of theirs."""
    user = host.environ.get("NCCL_CONF_FILE")
    if not user:
        try:
            user = os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".nccl.conf")
        except KeyError:
            return ["/etc/nccl.conf"]
    return [user, "/etc/nccl.conf"]


def read(host: Host) -> dict[str, list[tuple[str, str]]]:
    """Every NCCL_* (and GLOO_*) setting: name -> [(value, where)], the one NCCL uses first."""
    found: dict[str, list[tuple[str, str]]] = {}
    for key, value in host.environ.items():
        if key.startswith(("NCCL_", "GLOO_")):
            found.setdefault(key, []).append((value, ENVIRONMENT))
    for conf in conf_files(host):
        for name, value in conf_lines(_text(host, conf)):
            if name.startswith("NCCL_"):
                found.setdefault(name, []).append((value, conf))
    return found


def conf_lines(text: str) -> list[tuple[str, str]]:
    """(name, value) of each line as NCCL's setEnvFile (misc/param.cc) sets it: a line that begins
    with # is skipped, the name is everything before the first =, the value everything after, up to
    the newline, each kept as it is. "NCCL_SOCKET_IFNAME = ib0" sets a variable named with a space,
    which NCCL never reads, and "=ib0 # IPoIB" names an interface "ib0 # IPoIB": stripping either
    would judge a setting NCCL ignores, or pass one that fails every job."""
    out = []
    for line in text.split("\n"):
        if line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if sep and name:
            out.append((name, value))
    return out


def _text(host: Host, conf: str) -> str:
    """A config file's text: a regular file's first CONF_LIMIT bytes, opened without blocking,
    so a FIFO or a device put at its name can neither hang the run nor fill its memory ("" then)."""
    try:
        data = capture.read_file(host.path(conf), CONF_LIMIT)
    except OSError:
        return ""
    return data.decode(errors="replace") if data is not None else ""


def effective(found: dict[str, list[tuple[str, str]]]) -> dict[str, tuple[str, str]]:
    """name -> (value, where) that NCCL applies."""
    return {name: places[0] for name, places in found.items()}


def switches_on(found: dict[str, list[tuple[str, str]]]) -> list[tuple[str, str, str, str]]:
    """(name, value, where, cost) of each debugging switch NCCL will apply; NCCL ignores an empty value."""
    out = []
    for name, (value, where) in effective(found).items():
        if name in SWITCHES and value and SWITCHES[name][0](value):
            out.append((name, value, where, SWITCHES[name][1]))
    return sorted(out, key=lambda t: list(SWITCHES).index(t[0]))
