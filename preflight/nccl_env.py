"""NCCL's settings as NCCL itself sees them: the environment, then the
user's config file, then /etc/nccl.conf.

NCCL loads NCCL_CONF_FILE (else ~/.nccl.conf) and then /etc/nccl.conf without
overwriting what is already set, so the environment wins, then the user's
file, then the system's (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
"""

from __future__ import annotations

import os

from preflight.host import Host

ENVIRONMENT = "the environment"


def conf_files(host: Host) -> list[str]:
    user = host.environ.get("NCCL_CONF_FILE") or os.path.expanduser("~/.nccl.conf")
    return [user, "/etc/nccl.conf"]


def read(host: Host) -> dict[str, list[tuple[str, str]]]:
    """Every NCCL_* (and GLOO_*) setting: name -> [(value, where)], the one NCCL uses first."""
    found: dict[str, list[tuple[str, str]]] = {}
    for key, value in host.environ.items():
        if key.startswith(("NCCL_", "GLOO_")):
            found.setdefault(key, []).append((value, ENVIRONMENT))
    for conf in conf_files(host):
        try:
            text = host.read_text(conf)
        except (OSError, UnicodeDecodeError):
            continue
        for line in text.splitlines():
            key, sep, value = line.split("#", 1)[0].partition("=")
            if sep and key.strip().startswith("NCCL_"):
                found.setdefault(key.strip(), []).append((value.strip(), conf))
    return found


def effective(found: dict[str, list[tuple[str, str]]]) -> dict[str, tuple[str, str]]:
    """name -> (value, where) that NCCL applies."""
    return {name: places[0] for name, places in found.items()}
