"""How the NVML child (nvml_query.py) asks NVML one call: ``optional``, which turns a fact a
GPU, driver or nvidia-ml-py lacks into None (and any other failure into a note in
``unanswered``), ``field_number``, one value of nvmlDeviceGetFieldValues, and ``as_text``
for NVML's bytes. Standard library only.
"""

from __future__ import annotations

from typing import Any

# What `unanswered` says where nvidia-ml-py asked for a versioned NVML entry
# point the installed driver does not export (NVMLLibraryMismatchError).
LACKS_VERSIONED = "this driver lacks the versioned call nvidia-ml-py makes; an nvidia-ml-py of the driver's generation answers it"
# A field's own nvmlReturn that means the driver does not know the field (NVML_ERROR_INVALID_ARGUMENT,
# NVML_ERROR_NOT_SUPPORTED): a driver older than it. Unknown, as optional reads "not supported".
FIELD_ABSENT = (2, 3)
# nvml.h nvmlValueType_t -> the member of nvmlValue_t that holds the number.
FIELD_VALUE = {1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


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


def field_number(pynvml: Any, h: Any, field: int, ask: str, unanswered: dict[str, str]) -> int | None:
    """One field of nvmlDeviceGetFieldValues, a number; None where the driver does not know the
    field (a driver older than it: said nowhere) or fails it (said in ``unanswered`` under ``ask``).
    The call succeeds whatever the field; each field carries its own nvmlReturn."""
    asked: dict[str, str] = {}
    values = optional(pynvml, "nvmlDeviceGetFieldValues", h, [field], unanswered=asked)
    if asked:  # keyed by the field, not the call: several fields are read through it
        unanswered[ask] = next(iter(asked.values()))
    if not values:
        return None
    v = values[0]
    if v.nvmlReturn in FIELD_ABSENT:
        return None
    if v.nvmlReturn:
        try:
            unanswered[ask] = as_text(pynvml.nvmlErrorString(v.nvmlReturn))
        except Exception:  # noqa: BLE001 - the code still says it failed
            unanswered[ask] = f"NVML error {v.nvmlReturn}"
        return None
    return int(getattr(v.value, FIELD_VALUE.get(v.valueType, "uiVal")))
