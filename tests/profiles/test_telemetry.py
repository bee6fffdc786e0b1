"""NVML telemetry with a fake pynvml: decoded clocks-event reasons, units, and the unavailable paths."""

import logging
import math
import sys
import types

import pytest
import torch

from hotloop.profiles.epoch_table import TELEMETRY_COLUMNS
from hotloop.profiles.telemetry import NvmlTelemetry, decode_clocks_event_reasons

BITS = {
    "GpuIdle": 0x1,
    "ApplicationsClocksSetting": 0x2,
    "SwPowerCap": 0x4,
    "HwSlowdown": 0x8,
    "SyncBoost": 0x10,
    "SwThermalSlowdown": 0x20,
    "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
    "DisplayClockSetting": 0x100,
}


class NVMLError(Exception):
    pass


def fake_pynvml(prefix="nvmlClocksEventReason", reasons=0x4 | 0x20, fail=()):
    """A pynvml stand-in with NVML's real bit values under `prefix`; queries named in `fail` raise NVMLError."""

    def query(name, value):
        def call(*args):
            if name in fail:
                raise NVMLError(f"{name}: Not Supported")
            return value

        return call

    m = types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=query("init", None),
        nvmlDeviceGetHandleByIndex=query("handle", "h0"),
        nvmlDeviceGetHandleByUUID=query("uuid", "h-uuid"),
        nvmlDeviceGetPowerUsage=query("power", 412_345),
        nvmlDeviceGetTemperature=query("temp", 61),
        nvmlDeviceGetMemoryInfo=query("mem", types.SimpleNamespace(used=3 * 2**30)),
    )
    m.nvmlDeviceGetClockInfo = lambda h, clock: query("clock", 1980 if clock == 1 else 2619)()
    setattr(
        m,
        "nvmlDeviceGetCurrentClocksEventReasons" if "Event" in prefix else "nvmlDeviceGetCurrentClocksThrottleReasons",
        query("reasons", reasons),
    )
    for suffix, bit in BITS.items():
        setattr(m, prefix + suffix, bit)
    return m


@pytest.mark.parametrize(
    "mask,names",
    [
        (0, "none"),
        (0x1, "gpu_idle"),
        (0x4 | 0x20, "sw_power_cap+sw_thermal_slowdown"),
        (
            0x2 | 0x8 | 0x10 | 0x40 | 0x80,
            "applications_clocks_setting+hw_slowdown+sync_boost+hw_thermal_slowdown+hw_power_brake_slowdown",
        ),
        (0x1 | 0x4000, "gpu_idle+other_0x4000"),
    ],
)
@pytest.mark.smoke
@pytest.mark.parametrize("prefix", ["nvmlClocksEventReason", "nvmlClocksThrottleReason"])
def test_decode_reasons_from_either_constant_family(mask, names, prefix):
    assert decode_clocks_event_reasons(mask, fake_pynvml(prefix)) == names


@pytest.mark.parametrize("prefix", ["nvmlClocksEventReason", "nvmlClocksThrottleReason"])
def test_sample_reads_every_column_in_its_unit(monkeypatch, prefix, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(prefix))
    row = NvmlTelemetry(0).sample()
    assert list(row) == TELEMETRY_COLUMNS
    assert row == {
        "sm_clock_mhz": 1980.0,
        "mem_clock_mhz": 2619.0,
        "power_w": 412.345,
        "temp_c": 61.0,
        "clocks_event_reasons": "sw_power_cap+sw_thermal_slowdown",
        "gpu_mem_used_gib": 3.0,
    }
    assert not caplog.records


def _unavailable(row):
    return row["clocks_event_reasons"] == "" and all(
        math.isnan(v) for k, v in row.items() if k != "clocks_event_reasons"
    )


@pytest.mark.parametrize("broken", ["no module", "init fails"])
def test_unavailable_nvml_gives_nan_and_one_warning_line(monkeypatch, caplog, broken):
    monkeypatch.setitem(sys.modules, "pynvml", None if broken == "no module" else fake_pynvml(fail=("init",)))
    with caplog.at_level(logging.WARNING, logger="hotloop.profiles.telemetry"):
        telemetry = NvmlTelemetry(torch.device("cuda", 0) if broken == "init fails" else 0)
        rows = [telemetry.sample(), telemetry.sample()]
    assert all(_unavailable(r) for r in rows) and list(rows[0]) == TELEMETRY_COLUMNS
    assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage()
    assert "NVML unavailable" in caplog.records[0].getMessage()


def test_a_refused_query_gives_nan_for_its_column_only(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail=("power", "reasons")))
    telemetry = NvmlTelemetry("GPU-1234")
    row = telemetry.sample()
    telemetry.sample()
    assert math.isnan(row["power_w"]) and row["clocks_event_reasons"] == ""
    assert row["sm_clock_mhz"] == 1980.0 and row["gpu_mem_used_gib"] == 3.0
    assert len(caplog.records) == 1 and "power_w" in caplog.records[0].getMessage()


def test_cpu_device_measures_nothing_and_says_nothing(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    assert _unavailable(NvmlTelemetry(torch.device("cpu")).sample())
    assert not caplog.records
