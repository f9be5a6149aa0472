"""Children that die with the agent, and ranks that nobody else can reach.

The agent runs as root, and a run can be killed at any moment (the OOM killer,
systemd's final SIGKILL, a person). Its launches must not live on after it:
a rank left running holds GPU memory, and a long burn-in would heat the GPUs
for minutes beside the next run. Linux's parent-death signal
(PR_SET_PDEATHSIG) kills a process the moment its parent dies, but "parent"
means the *thread* that forked it: a check's thread ends while the launch it
started serves later checks. So every tethered child is forked by one thread
that lives as long as the agent (``_Spawner``), through this file run as a
script (a trampoline of the standard library only, under the agent's own
Python): it sets the signal, makes sure its parent is still the agent, and
execs the command. torchrun's ranks tie themselves to torchrun the same way
(checks/workers/_rank.py), so the agent's death takes the whole tree within
milliseconds, ranks in sessions of their own included.

The trampoline also gives a single-node launch a network of its own: a new
network namespace holding only a loopback interface (``--net private``). The
rendezvous store, gloo's and NCCL's sockets then listen where no other host
and no other process of this machine can connect: nothing another user writes
can reach the ranks. Root gets the namespace directly; any other user through
a user namespace of their own, where the kernel allows it. Where neither is
allowed (a container without CAP_SYS_ADMIN), the launch runs on the host's
network and the trampoline says why (``isolation``).

The descriptors ``hold`` names (the run lock) are inherited by every tethered
child, so the lock stays held while anything the run started still lives.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys

AGENT_ENV = "PREFLIGHT_AGENT"  # "PID:STARTTIME" of the agent that started this process
LAUNCHER_ENV = "PREFLIGHT_LAUNCHER_PID"  # the pid the trampoline exec'ed into (torchrun, or a plain worker)
PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
EXIT_ORPHANED = 125  # the agent was gone before the command could start


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), which
    with the pid names one process for the whole boot; None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def agent_mark(pid: int | None = None) -> str:
    """This process as its children's environment names it: "PID:STARTTIME"."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_time(pid) or '?'}"


def mark_alive(mark: str) -> bool:
    """Whether the process an ``agent_mark`` names still runs (a reused pid does not count)."""
    pid, _, started = mark.partition(":")
    return pid.isdigit() and started != "?" and start_time(int(pid)) == started


def die_with_parent(parent: int) -> bool:
    """SIGKILL this process when ``parent`` dies; False where the parent is already gone
    (the signal only covers a death after it is set, so the parent is checked after)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the agent's sweep by environment is the only net
    return os.getppid() == parent


# --- the agent's side -------------------------------------------------------

_held: set[int] = set()


def hold(fd: int) -> None:
    """Every tethered child inherits ``fd`` from now on (the run lock: held while they live)."""
    _held.add(fd)


def release(fd: int) -> None:
    _held.discard(fd)


class _Spawner:
    """One thread, alive as long as the agent, forks every tethered child, so that the
    parent-death signal fires when the agent dies and not when a check's thread ends."""

    def __init__(self) -> None:
        import queue
        import threading

        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, argv: list[str], kwargs: dict):
        import subprocess
        import threading

        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="preflight-spawner", daemon=True)
                self._thread.start()
        done, box = threading.Event(), {}
        self._jobs.put((argv, kwargs, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        proc: subprocess.Popen = box["proc"]
        return proc

    def _serve(self) -> None:
        import subprocess

        while True:
            argv, kwargs, box, done = self._jobs.get()
            try:
                box["proc"] = subprocess.Popen(argv, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
                box["error"] = e
            done.set()


_spawner = _Spawner()


def popen(argv: list[str], *, private_net: bool = False, report: str | None = None, **kwargs):
    """``subprocess.Popen(argv, **kwargs)``, tethered: the command dies with the agent.
    ``private_net`` runs it in a network namespace of its own with only loopback up;
    ``report`` names a file where the trampoline writes whether it got one (``isolation``).
    Raises OSError as Popen would where the command cannot be found or run."""
    import shutil

    env = kwargs.get("env")
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    exe = shutil.which(argv[0], path=path) if os.sep not in argv[0] else argv[0]
    if exe is None or not os.path.exists(exe):
        raise FileNotFoundError(2, "No such file or directory", argv[0])
    if os.path.isdir(exe) or not os.access(exe, os.X_OK):
        raise PermissionError(13, "Permission denied", argv[0])
    me = os.getpid()
    wrapped = [sys.executable, "-I", "-S", __file__, "--agent", str(me)]
    if private_net:
        wrapped += ["--net", "private"]
    if report:
        wrapped += ["--report", report]
    return _spawner.popen([*wrapped, "--", exe, *argv[1:]], _marked(kwargs, me))


def _marked(kwargs: dict, me: int) -> dict:
    """Popen's arguments for a tethered child: the agent's mark in its environment, the held descriptors passed."""
    env = kwargs.get("env")
    return {**kwargs, "env": {**(env if env is not None else os.environ), AGENT_ENV: agent_mark(me)},
            "pass_fds": tuple(sorted({*kwargs.get("pass_fds", ()), *_held}))}


def popen_tool(argv: list[str], **kwargs):
    """``subprocess.Popen(argv, **kwargs)`` for a tool (nvidia-smi, lspci, journalctl): tethered
    as ``popen``'s children are, but without the trampoline. The spawner's fork sets the
    parent-death signal before the exec, so a tool costs no interpreter's start, and a
    command that cannot be run raises OSError here, as Popen's own. Before the signal is set
    the agent may already be gone: the child checks its parent after, and exits if so."""
    prctl = _prctl()
    me = os.getpid()

    def tie() -> None:  # in the child, between fork and exec: no imports, no locks
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
        if os.getppid() != me:
            os._exit(EXIT_ORPHANED)

    return _spawner.popen([_absolute(argv[0], kwargs.get("env")), *argv[1:]], {**_marked(kwargs, me), "preexec_fn": tie})


def _absolute(name: str, env: dict | None) -> str:
    """``name`` as exec would find it, by a path from the root: a tool found only through an
    empty or relative entry of PATH (``:/usr/bin``, ``.``) is a file in the working directory,
    a directory such as /tmp where anyone may have put a `journalctl` of theirs for root to run."""
    # Only the entries that are paths from the root are searched: a relative one ahead of /usr/bin holding
    # a file of the tool's name would otherwise stop the search there and cost the node its real tool.
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    found = name if os.sep in name else shutil.which(name, path=os.pathsep.join(p for p in path.split(os.pathsep) if os.path.isabs(p)))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", name)
    if not os.path.isabs(found):
        raise PermissionError(errno.EACCES, f"{found} is a path in the working directory (an empty or relative entry of PATH): "
                              "preflight runs no tool from there", name)
    return found


_libc_prctl: list = []


def _prctl():
    """libc's prctl, looked up once, before any fork (None where there is none: not Linux)."""
    if not _libc_prctl:
        try:
            import ctypes

            _libc_prctl.append(ctypes.CDLL(None, use_errno=True).prctl)
        except (OSError, AttributeError):
            _libc_prctl.append(None)
    return _libc_prctl[0]


def isolation(report: str) -> dict | None:
    """What the trampoline wrote to ``report``: {"network": "private"} or {"network": "host",
    "why": ...}; None before it has run."""
    try:
        with open(report) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# --- the trampoline's side (run as a script, standard library only) -------


def _private_network() -> dict:
    """Move this process into a new network namespace with loopback up; what happened.
    Never leaves it half made: a launch either gets the whole namespace or the host's network."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() == 0:
        # Root only ever takes a plain network namespace: in a user namespace it would lose its
        # power over other users' files (a --python in a user's 0700 venv). Where loopback cannot
        # be brought up there (CAP_SYS_ADMIN without CAP_NET_ADMIN, as `docker --cap-add SYS_ADMIN`
        # gives), it goes back to the namespace it came from.
        home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.unshare(CLONE_NEWNET) != 0:
                return {"network": "host", "why": f"the kernel refused a network namespace: {os.strerror(ctypes.get_errno())}"}
            try:
                _loopback_up()
                return {"network": "private"}
            except OSError as e:
                if libc.setns(home, CLONE_NEWNET) != 0:
                    return {"network": "broken", "why": f"loopback could not be brought up ({e.strerror or e}), nor the host's network taken back"}
                return {"network": "host", "why": f"loopback could not be brought up in a network namespace: {e.strerror or e}"}
        finally:
            os.close(home)
    # Anyone else needs a user namespace of their own, which cannot be left again: try it in a
    # child first, and take it here only where the child got all of it.
    pid = os.fork()
    if pid == 0:
        try:
            _enter_user_network(libc)
            os._exit(0)
        except BaseException:  # noqa: BLE001 - the child says only yes or no
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return {"network": "host", "why": "the kernel refused a user and network namespace (user namespaces off, or no CAP_NET_ADMIN there)"}
    try:
        _enter_user_network(libc)
    except OSError as e:
        return {"network": "broken", "why": f"the private network could not be set up: {e.strerror or e}"}
    return {"network": "private"}


def _enter_user_network(libc) -> None:
    import ctypes

    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    # The same ids inside as outside: files and GPU device nodes see the same user.
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    _loopback_up()


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def _main(argv: list[str]) -> int:
    sep = argv.index("--")
    opts, command = argv[:sep], argv[sep + 1 :]
    get = lambda name: opts[opts.index(name) + 1] if name in opts else None  # noqa: E731
    agent, net, report = int(get("--agent") or 0), get("--net"), get("--report")
    outcome = _private_network() if net == "private" else {"network": "host", "why": "not asked"}
    if report:
        tmp = report + ".tmp"
        with open(tmp, "w") as f:
            json.dump(outcome, f)
        os.replace(tmp, report)
    if outcome["network"] == "broken":
        print(f"preflight: {outcome['why']}", file=sys.stderr)
        return 126
    if not die_with_parent(agent):
        return EXIT_ORPHANED
    os.environ[LAUNCHER_ENV] = str(os.getpid())
    try:
        os.execv(command[0], command)
    except OSError as e:
        print(f"preflight: cannot run {command[0]}: {e.strerror or e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
