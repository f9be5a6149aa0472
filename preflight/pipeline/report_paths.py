"""Where the report is: the node's own (root's state directory, the systemd units'), a
user's own (their XDG state directory), and which one each reader reads when neither a
flag nor the settings name one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

# Root's state: the systemd units' StateDirectory, and where `run` as root writes its report by default.
ROOT_STATE_DIR = Path("/var/lib/preflight")
DEFAULT_REPORT_PATH = ROOT_STATE_DIR / "report.json"


def default_report_path(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """The report `run` writes and every reader reads when neither a flag nor the settings name one.
    Root: DEFAULT_REPORT_PATH, the node's own. Anyone else: their own state directory, as the
    XDG Base Directory spec puts it: ``$XDG_STATE_HOME/preflight/report.json`` where that is
    an absolute path (a relative one is invalid and ignored), else ``~/.local/state/preflight/report.json``."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return ROOT_STATE_DIR / "report.json"  # DEFAULT_REPORT_PATH; read here, where the tests move it
    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME", "")
    if state.startswith("/"):
        return Path(state) / "preflight" / "report.json"
    home = environ.get("HOME", "")
    if not home.startswith("/"):
        import pwd  # as os.path.expanduser does, for this user rather than the process's HOME

        try:
            home = pwd.getpwuid(euid).pw_dir
        except KeyError:
            home = "/"
    return Path(home) / ".local" / "state" / "preflight" / "report.json"


def node_report_path() -> Path:
    """The node's own report, whoever asks: what the systemd units and every root run write, and
    what the readers that act for the node (slurm-healthcheck, kube-label, serve, `status --npd`)
    read when nothing names one; never a user's own, which the user could write."""
    return ROOT_STATE_DIR / "report.json"


def reader_report_path(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """The report a person's reader (status, report, history) reads when neither a flag nor the
    settings name one: the user's own default where they have one that no other user could
    have written, else the node's. An admin asking `preflight status` without sudo, with no
    report of their own, reads the node's verdict."""
    euid = os.geteuid() if euid is None else euid
    own, node = default_report_path(environ, euid), node_report_path()
    if own == node or _own(own, euid) or not node.exists():
        return own
    return node


def _own(path: Path, euid: int) -> bool:
    """``path`` is there, and neither it nor its directory is another user's or writable by others."""
    try:
        for st in (os.stat(path), os.stat(path.parent)):
            if st.st_uid != euid or st.st_mode & 0o022:
                return False
    except OSError:
        return False
    return True
