"""phase_range: NVTX push/pop pairs (nesting, exceptions, decorator), the torch.cuda.nvtx fallback, and the
record_function seen in a real CPU torch.profiler trace read back with read_kineto."""

import sys
import types

import pytest
import torch

from hotloop.profiles import ranges
from hotloop.profiles.kineto_reader import read_kineto
from hotloop.profiles.ranges import DEFAULT_COLOR, PHASE_COLORS, nvtx_backend, phase_range, range_cost_ns


@pytest.fixture(autouse=True)
def _fresh_backend():
    nvtx_backend.cache_clear()
    yield
    nvtx_backend.cache_clear()


@pytest.fixture
def calls(monkeypatch):
    """A fake `nvtx` package whose domain logs ("push", domain, name, color) and ("pop", domain)."""
    log = []

    class Domain:
        def __init__(self, name):
            self.name = name

        def get_event_attributes(self, message, color):
            return (message, color)

        def push_range(self, attributes):
            log.append(("push", self.name, *attributes))

        def pop_range(self):
            log.append(("pop", self.name))

    monkeypatch.setitem(sys.modules, "nvtx", types.SimpleNamespace(get_domain=Domain))
    return log


@pytest.mark.smoke
def test_nested_ranges_push_and_pop_in_order_with_phase_colors(calls):
    with phase_range("step"):
        with phase_range("forward"):
            pass
        with phase_range("mine", color=0xFF000001):
            pass
    assert nvtx_backend()[0] == "nvtx"
    assert calls == [
        ("push", "hotloop", "step", PHASE_COLORS["step"]),
        ("push", "hotloop", "forward", PHASE_COLORS["forward"]),
        ("pop", "hotloop"),
        ("push", "hotloop", "mine", 0xFF000001),
        ("pop", "hotloop"),
        ("pop", "hotloop"),
    ]
    assert phase_range("unknown").color == DEFAULT_COLOR


def test_an_exception_closes_the_range_and_propagates(calls):
    with pytest.raises(KeyError):
        with phase_range("loss"):
            raise KeyError("boom")
    assert calls == [("push", "hotloop", "loss", PHASE_COLORS["loss"]), ("pop", "hotloop")]


def test_decorator_opens_one_range_per_call_also_recursively(calls):
    @phase_range("evaluate")
    def depth(n):
        return 0 if n == 0 else 1 + depth(n - 1)

    assert depth(2) == 2
    assert [c[0] for c in calls] == ["push", "push", "push", "pop", "pop", "pop"]


def test_without_nvtx_package_falls_back_to_torch_cuda_nvtx(monkeypatch):
    log = []
    monkeypatch.setitem(sys.modules, "nvtx", None)  # `import nvtx` raises ImportError
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: log.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: log.append(("pop",)))
    with pytest.raises(RuntimeError):
        with phase_range("optimizer"):
            with phase_range("spectral_norm"):
                raise RuntimeError
    assert nvtx_backend()[0] == "torch.cuda.nvtx"
    assert log == [("push", "optimizer"), ("push", "spectral_norm"), ("pop",), ("pop",)]


def test_without_nvtx_and_without_cuda_build_ranges_are_no_ops(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvtx", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    with phase_range("readback"):
        pass
    assert nvtx_backend()[0] == "none"


def test_record_function_of_the_same_name_is_in_a_cpu_kineto_trace(tmp_path, calls):
    x = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with phase_range("step"):
            with phase_range("forward"):
                x = x @ x
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = read_kineto(path)
    spans = events[events.kind == "user_annotation"].set_index("name")
    assert {"step", "forward"} <= set(spans.index)
    step, forward = spans.loc["step"], spans.loc["forward"]
    assert step.start_us <= forward.start_us and forward.start_us + forward.dur_us <= step.start_us + step.dur_us
    assert ("push", "hotloop", "step", PHASE_COLORS["step"]) in calls


def test_no_record_function_while_no_profiler_records(monkeypatch, calls):
    monkeypatch.setattr(torch.profiler, "record_function", lambda name: pytest.fail("record_function created"))
    with phase_range("sample"):
        pass


def test_range_cost_is_measured_in_ns():
    cost = range_cost_ns(n=2000, repeats=3)
    assert 0 < cost < 1e6
    with pytest.raises(ValueError, match="n=0"):
        range_cost_ns(n=0)
    assert ranges.DOMAIN == "hotloop"
