"""NVML telemetry of one GPU via pynvml (nvidia-ml-py), sampled outside the hot loop (at epoch end).

Columns: hotloop.profiles.epoch_table.TELEMETRY_COLUMNS. Source: the NVML API reference (nvmlDeviceGetClockInfo,
nvmlDeviceGetPowerUsage, nvmlDeviceGetTemperature, nvmlDeviceGetCurrentClocksEventReasons - formerly
...ThrottleReasons -, nvmlDeviceGetMemoryInfo). Where NVML is missing (no driver, no GPU, a CPU run) every value
is NaN and the reasons "", no exception escapes, and at most one warning line is logged per NvmlTelemetry.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Callable

import torch

from hotloop.profiles.epoch_table import TELEMETRY_COLUMNS

log = logging.getLogger(__name__)

CLOCKS_EVENT_REASONS = (  # (decoded name, suffix of pynvml's nvmlClocksEventReason* / nvmlClocksThrottleReason*)
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks_setting", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal_slowdown", "SwThermalSlowdown"),
    ("hw_thermal_slowdown", "HwThermalSlowdown"),
    ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
    ("display_clock_setting", "DisplayClockSetting"),
)


def decode_clocks_event_reasons(mask: int, nvml) -> str:
    """Names of the bits set in an NVML clocks-event-reasons mask, in CLOCKS_EVENT_REASONS order, joined by "+";
    "none" for 0; bits no known constant covers as "other_0x<hex>". Bit values come from `nvml` (the pynvml
    module): nvmlClocksEventReason<Suffix>, else nvmlClocksThrottleReason<Suffix> (older pynvml)."""
    names, known = [], 0
    for name, suffix in CLOCKS_EVENT_REASONS:
        bit = getattr(nvml, f"nvmlClocksEventReason{suffix}", None) or getattr(
            nvml, f"nvmlClocksThrottleReason{suffix}", 0
        )
        if mask & bit:
            names.append(name)
        known |= bit
    if mask & ~known:
        names.append(f"other_{mask & ~known:#x}")
    return "+".join(names) or "none"


def unavailable_sample() -> dict[str, float | str]:
    """A sample with nothing measured: NaN for every TELEMETRY_COLUMNS column, "" for clocks_event_reasons."""
    return {c: "" if c == "clocks_event_reasons" else math.nan for c in TELEMETRY_COLUMNS}


class NvmlTelemetry:
    """NVML handle of one GPU; `sample()` reads its TELEMETRY_COLUMNS. Call it outside the hot loop (each query
    is a driver call of tens of microseconds, and the samples are meant per epoch).

    Args:
        device: a torch.device (cuda: the NVML device of the same UUID, else of its index; any other type:
            nothing is measured and nothing is logged), an int (NVML index) or a str (NVML UUID, "GPU-...").
    """

    def __init__(self, device: torch.device | int | str = 0) -> None:
        self._nvml = self._handle = None
        self._warned = False
        if isinstance(device, torch.device) and device.type != "cuda":
            return
        try:
            nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
            self._handle = _handle(nvml, device)
            self._nvml = nvml
        except Exception as exc:  # ImportError, pynvml.NVMLError (no driver/library/device), RuntimeError
            self._warn(f"NVML unavailable ({type(exc).__name__}: {exc})")

    def sample(self) -> dict[str, float | str]:
        """{column: value} for TELEMETRY_COLUMNS: sm_clock_mhz, mem_clock_mhz (current clocks, MHz), power_w (board
        power draw, W), temp_c (GPU core, deg C), clocks_event_reasons (decode_clocks_event_reasons of the current
        mask), gpu_mem_used_gib (used by all processes, GiB). A query NVML refuses gives NaN / "" for its column."""
        row = unavailable_sample()
        nvml, h = self._nvml, self._handle
        if nvml is None:
            return row
        queries: dict[str, Callable[[], float | str]] = {
            "sm_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            "mem_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temp_c": lambda: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            "clocks_event_reasons": lambda: decode_clocks_event_reasons(int(_reasons_query(nvml)(h)), nvml),
            "gpu_mem_used_gib": lambda: nvml.nvmlDeviceGetMemoryInfo(h).used / 2**30,
        }
        for column, query in queries.items():
            try:
                row[column] = query()
            except Exception as exc:  # pynvml.NVMLError_NotSupported and the like
                self._warn(f"NVML query for {column} failed ({type(exc).__name__}: {exc})")
        return row

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("hotloop telemetry: %s; such columns are NaN", message)


def _reasons_query(nvml) -> Callable:
    return (
        getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )


def _handle(nvml, device: torch.device | int | str):
    if isinstance(device, int):
        return nvml.nvmlDeviceGetHandleByIndex(device)
    if isinstance(device, str):
        return nvml.nvmlDeviceGetHandleByUUID(device)
    index = torch.cuda.current_device() if device.index is None else device.index
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    try:
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except nvml.NVMLError:
        return nvml.nvmlDeviceGetHandleByIndex(index)
