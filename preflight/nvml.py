"""The NVML seam: the only module that talks to nvidia-ml-py (`import pynvml`).

It exposes only the facts checks use, and turns NVML's errors into a cause
and a remedy a person can act on. NVML runs in a child process with a
deadline: on a wedged driver nvmlInit can block forever, and the agent must
not.
"""

from __future__ import annotations

import json
import sys

NO_DRIVER = "install or load the NVIDIA driver (`nvidia-smi` must answer); on a machine with no GPU use --profile cpu for a dry run"
BROKEN = "look for Xid errors in `dmesg`; reset the GPU (`nvidia-smi -r`) or reboot, and drain the node until NVML answers"
NO_ACCESS = "run preflight as root, or give its user access to /dev/nvidia* (the video group on most distributions)"


class NvmlUnavailable(Exception):
    def __init__(self, cause: str, remedy: str):
        super().__init__(cause)
        self.cause = cause
        self.remedy = remedy


def _query() -> dict[str, object]:
    """Runs in the child: GPU product names, or the error as data."""
    try:
        import pynvml
    except ImportError:
        return {"cause": "nvidia-ml-py is not installed", "remedy": "pip install nvidia-ml-py"}
    try:
        pynvml.nvmlInit()
        try:
            names = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                names.append(name.decode() if isinstance(name, bytes) else name)
            return {"names": names}
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError_LibraryNotFound:
        return {"cause": "no NVIDIA driver: the NVML library libnvidia-ml.so.1 was not found", "remedy": NO_DRIVER}
    except pynvml.NVMLError_DriverNotLoaded:
        return {"cause": "no NVIDIA driver: the nvidia kernel module is not loaded", "remedy": NO_DRIVER}
    except pynvml.NVMLError_NoPermission:
        return {"cause": "NVML refused access: no permission on /dev/nvidia*", "remedy": NO_ACCESS}
    except pynvml.NVMLError as e:  # GPU lost, Unknown Error, ...: the driver is there, a GPU is not well
        return {"cause": f"NVML failed: {e}", "remedy": BROKEN}


def gpu_names(timeout: float = 20.0) -> list[str]:
    """Product name of every GPU NVML sees, in NVML index order."""
    from preflight.host import Host

    # cwd "/": `python -m` puts the working directory first on sys.path, and a
    # pynvml.py lying there must not run as root.
    done = Host().run([sys.executable, "-m", "preflight.nvml"], timeout, cwd="/")
    if done.timed_out:
        raise NvmlUnavailable(f"NVML did not answer within {timeout:g} s: the driver is wedged", BROKEN)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise NvmlUnavailable(f"the NVML query died (exit {done.returncode}): {tail}", BROKEN) from None
    if "names" not in answer:
        raise NvmlUnavailable(answer["cause"], answer["remedy"])
    return list(answer["names"])


if __name__ == "__main__":
    print(json.dumps(_query()))
    sys.exit(0)
