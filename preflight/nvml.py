"""The NVML seam: the only module that talks to nvidia-ml-py (`import pynvml`).

It exposes only the facts checks use, and turns NVML's errors into causes a
person can act on. NVML errors are mapped here once so every caller names the
same cause for the same failure.
"""

from __future__ import annotations


class NvmlUnavailable(Exception):
    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


def _cause(err: Exception) -> str:
    import pynvml

    if isinstance(err, pynvml.NVMLError_LibraryNotFound):
        return "no NVIDIA driver: the NVML library libnvidia-ml.so.1 was not found"
    if isinstance(err, pynvml.NVMLError_DriverNotLoaded):
        return "no NVIDIA driver: the nvidia kernel module is not loaded"
    if isinstance(err, pynvml.NVMLError_NoPermission):
        return "NVML refused access (no permission on /dev/nvidia*)"
    return f"NVML failed: {err}"


def gpu_names() -> list[str]:
    """Product name of every GPU NVML sees, in NVML index order."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(_cause(e)) from None
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else name)
        return names
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(_cause(e)) from None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
