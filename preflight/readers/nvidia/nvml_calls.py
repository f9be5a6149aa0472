"""How the NVML child (nvml_query.py) asks NVML one call: ``optional``, which turns a fact a
GPU, driver or nvidia-ml-py lacks into None (and any other failure into a note in
``unanswered``), and ``as_text`` for NVML's bytes. Standard library only.
"""

from __future__ import annotations

from typing import Any

# What `unanswered` says where nvidia-ml-py asked for a versioned NVML entry
# point the installed driver does not export (NVMLLibraryMismatchError).
LACKS_VERSIONED = "this driver lacks the versioned call nvidia-ml-py makes; an nvidia-ml-py of the driver's generation answers it"


def as_text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def optional(pynvml: Any, fn: str, *args: Any, unanswered: dict[str, str] | None = None) -> Any:
    """A fact this GPU or driver may not have: None instead of an error.

    A GPU that is lost raises on, so the caller records it as lost; whether a
    GPU is lost is decided by the calls every GPU answers (handle, PCI, name,
    UUID). Any error but "not supported" is noted in ``unanswered``: a health
    query that fails must not read as healthy. Nothing else escapes: one
    query's surprise must not cost every GPU's facts.
    """
    f = getattr(pynvml, fn, None)
    if f is None:  # an older nvidia-ml-py without the call
        return None
    try:
        return f(*args)
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as e:
        absent = tuple(getattr(pynvml, f"NVMLError_{n}", ()) for n in ("NotSupported", "InvalidArgument", "FunctionNotFound"))
        if unanswered is not None and not isinstance(e, absent):
            unanswered[fn] = str(e)
        return None
    except getattr(pynvml, "NVMLLibraryMismatchError", ()):  # not an NVMLError: raised by nvidia-ml-py itself
        if unanswered is not None:
            unanswered[fn] = LACKS_VERSIONED
        return None
    except Exception as e:  # noqa: BLE001 - a binding bug or an odd answer: unknown, not a dead child
        if unanswered is not None:
            unanswered[fn] = f"{type(e).__name__}: {e}"
        return None
