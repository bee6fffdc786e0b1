"""How many bytes a training run of a Config allocates on its device, and whether the device has them free.

Checked before anything is trained or written (hotloop.guards.commands.checks.check_run), so that a config asking
for more memory than the machine has (`replay_capacity=1e12`, `trunk_hidden=[1e6, 1e6]`) stops with exit 2 naming
the fields, instead of an allocator traceback after the run folder was made.

The estimate (`estimate_memory`) follows the real layouts, in bytes (float32 = 4, int64 = 8):

- replay (trainer/replay/prioritized.py `PrioritizedReplay`): per transition obs and next_obs (obs_dim float32
  each), the action (one int64 per branch), reward and terminated flag (float32 each); plus the sum tree
  (kernels/sum_tree.py `SumTree.nodes`: 2 P float32, P = capacity rounded up to a power of two).
- networks: P parameters (trainer/flat_net.py `FlatLayout.numel`, the same count as trainer/network.py's
  BranchingDuelingQNet with its gains), kept 9 times: online, target, gradients, Adam's two moments
  (kernels/fused_adam.py), and the hotloop learner's transposed weights, its TF32-rounded copy of both nets and
  the acting forward's of the online one (the reference learner's spectral-norm vectors are far smaller).
- learner buffers at batch size B (trainer/step.py `HotLearner`; the reference learner's autograd activations are
  fewer): per hidden unit 8 floats per sample (activations, their TF32-split transposes, the Double-DQN forward's
  two nets, the pre-activation gradients), per Q output 8 (Q, Q of s' for both nets, the TD loss's outputs and
  gradient), per observation element 4 (the sampled obs and next_obs, the transposed split obs), and 16 for the
  sampled indices, weights, rewards and flags.
- envs: num_envs + eval_episodes copies of the observation, final observation, noise and step uniforms (6 floats
  per observation element) and the acting forward's activations; the synthetic env's (obs_dim, obs_dim) and
  (obs_dim, sum of branch sizes) matrices.

It leaves out what does not scale with the config (CUDA context, Triton workspaces, the CUDA graph's pool, small
counters) and counts the learner's buffers for the larger of the two learners, so it is an estimate, not a bound:
on the H200, seed-scale (hotloop learner) was estimated at 931 MB, and torch.cuda.max_memory_allocated read 877 MB
after the Trainer was built and had run one train step (798 MB before it). The check refuses a run only when the
estimate exceeds the free memory, so a run within a few percent of the device's free memory may be refused.

The guarded window of `hotloop gate` (`estimate_window_memory`, checked by `check_window_memory` before anything
runs) costs host memory in proportion to its loop iterations K and its repeats R: torch.profiler keeps every event of
the window in memory, then the window's trace is exported, read back into frames and judged; each repeat's report is
kept until the gate ends. Its estimate is K x R x bytes per guarded step (`window_bytes_per_step`):

- CPU: measured with `hotloop gate --device cpu --epochs 1 --set learner_steps_per_epoch=50 --no-baseline` on the
  default preset (cartpole, reference learner; torch 2.13 CPU, 2 cores, 23 GB): peak RSS 546 MB at
  --guard-steps 1, 1177 MB at 100, 2430 MB at 300 (6.3 MB per guarded step, 2948 trace events per step: 2.1 kB per
  event), 3769 MB at 300 with --repeats 2 (a second repeat adds 4.5 MB per step more). The seed-scale preset
  (spectral norm, 4 branches; widths shrunk, which do not change the op count) has 4962 events per step. The bound
  taken: CPU_EVENTS_PER_STEP = 5000 events x BYTES_PER_EVENT 2.2 kB = 11 MB per step (at 3000 steps, 33 GB; the
  issue-41 report: 18.5 GB peak at 3000 steps of the default preset).
- CUDA, hotloop learner (one CUDA graph per learner step): 12,740 events per 100-step window on the H200
  (results/h200/gate logs, seed-scale, 127 per step); bound CUDA_GRAPH_EVENTS_PER_STEP = 1000 (2.2 MB per step).
- CUDA, reference learner (eager): not measured; bound CUDA_EAGER_EVENTS_PER_STEP = 5 x the CPU bound (each op's
  CPU event plus, per kernel it launches, a runtime event, a kernel event and two flow events): 55 MB per step.

Available memory (`available_memory`): on CUDA, the free bytes of `torch.cuda.mem_get_info`; on the CPU,
MemAvailable of /proc/meminfo (else os.sysconf's available physical pages), capped by the cgroup's limit minus its
usage where one is set (cgroup v2 memory.max / memory.current, v1 memory.limit_in_bytes / memory.usage_in_bytes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from hotloop.trainer.config import Config

FLOAT32 = 4
INT64 = 8
NET_COPIES = 9
"""Copies of the P parameters a learner keeps: online, target, gradients, Adam's two moments, transposed weights,
both nets rounded to TF32 (the learner step's forward weights) and the acting forward's rounded copy."""
BYTES_PER_EVENT = 2_200
"""Host bytes per profiler event of the guarded window at its peak (measured 2.1 kB on the CPU: module docstring)."""
CPU_EVENTS_PER_STEP = 5_000
"""Trace events per guarded step on the CPU, a bound (measured 2948 cartpole, 4962 seed-scale: module docstring)."""
CUDA_GRAPH_EVENTS_PER_STEP = 1_000
"""Trace events per guarded step on CUDA with the hotloop learner, a bound (127 measured on the H200)."""
CUDA_EAGER_EVENTS_PER_STEP = 5 * CPU_EVENTS_PER_STEP
"""Trace events per guarded step on CUDA with the reference learner, a bound (not measured: module docstring)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run allocates on its device, by part (ints, bytes), and the parameter count `params` (P)."""

    replay: int
    nets: int
    learner: int
    envs: int
    params: int

    @property
    def total(self) -> int:
        """replay + nets + learner + envs, in bytes."""
        return self.replay + self.nets + self.learner + self.envs


def param_count(obs_dim: int, action_nvec: tuple[int, ...], trunk_hidden: tuple[int, ...], head_hidden: int) -> int:
    """Parameters P of the branching dueling Q-network (trainer/flat_net.py FlatLayout.numel for equal branches;
    BranchingDuelingQNet's weights, biases and gains otherwise): each trunk layer W (t_i, t_{i-1}) + b + 1 gain;
    the stacked hidden layer ((1 + D) H, t_last) + (1 + D) H biases + 1 + D gains; the output layer
    (1 + sum(A_d), H) + 1 + sum(A_d) biases + 1 + D gains. Python ints (no overflow for any size)."""
    widths = (obs_dim, *trunk_hidden)
    p = sum(a * b + b + 1 for a, b in zip(widths, widths[1:]))
    d, h, outs = len(action_nvec), head_hidden, 1 + sum(action_nvec)
    p += (1 + d) * h * widths[-1] + (1 + d) * h + (1 + d)
    p += outs * h + outs + (1 + d)
    return p


def replay_bytes(capacity: int, obs_dim: int, num_branches: int) -> int:
    """Bytes of `PrioritizedReplay(capacity, obs_dim, num_branches)` (float32 observations): obs and next_obs
    (capacity, obs_dim) float32, action (capacity, num_branches) int64, reward and terminated (capacity,) float32,
    and the sum tree's 2 P float32 nodes, P = the next power of two >= capacity (kernels/sum_tree.py)."""
    leaves = 1 << (capacity - 1).bit_length()
    return capacity * (2 * obs_dim * FLOAT32 + num_branches * INT64 + 2 * FLOAT32) + 2 * leaves * FLOAT32


def estimate_memory(cfg: Config, obs_dim: int, action_nvec: tuple[int, ...]) -> MemoryEstimate:
    """The bytes a run of `cfg` allocates on its device (module docstring: what each part counts), for the env's
    `obs_dim` and `action_nvec` (the env reports them; the synthetic env takes cfg's). Pure arithmetic on Python
    ints: nothing is allocated, and no size is too large to estimate."""
    d, q = len(action_nvec), 1 + sum(action_nvec)
    hidden = sum(cfg.trunk_hidden) + (1 + d) * cfg.head_hidden
    params = param_count(obs_dim, tuple(action_nvec), tuple(cfg.trunk_hidden), cfg.head_hidden)
    learner = cfg.batch_size * FLOAT32 * (8 * hidden + 8 * q + 4 * obs_dim + 16)
    envs = (cfg.num_envs + cfg.eval_episodes) * FLOAT32 * (6 * obs_dim + hidden + q + 2 * d + 8)
    if cfg.env == "synthetic":
        envs += obs_dim * (obs_dim + 2 * sum(action_nvec)) * FLOAT32
    return MemoryEstimate(
        replay_bytes(cfg.replay_capacity, obs_dim, d), NET_COPIES * params * FLOAT32, learner, envs, params
    )


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup memory limit (limit - usage); None where no limit is set."""
    for limit_file, usage_file in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        root = Path("/sys/fs/cgroup")
        limit, usage = _read_int(root / limit_file), _read_int(root / usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:  # v1 reports "no limit" as ~2^63
            return max(0, limit - usage)
    return None


def available_memory(device: torch.device, meminfo: str | Path = "/proc/meminfo") -> tuple[int | None, str]:
    """(bytes free for a run on `device`, where that number comes from); (None, why) when it cannot be read.

    CUDA: torch.cuda.mem_get_info(device)'s free bytes (this creates the CUDA context). CPU: MemAvailable of
    `meminfo` (kB), else os.sysconf SC_AVPHYS_PAGES x SC_PAGE_SIZE; capped by the cgroup's limit minus usage."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free memory of {device} (torch.cuda.mem_get_info)"
    avail, source = None, ""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail, source = int(line.split()[1]) * 1024, f"MemAvailable in {meminfo}"
                break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            source = "available physical pages (os.sysconf)"
        except (OSError, ValueError, AttributeError):
            return None, "no MemAvailable in /proc/meminfo and no os.sysconf SC_AVPHYS_PAGES"
    room = _cgroup_room()
    if room is not None and room < avail:
        avail, source = room, "the cgroup's memory limit minus its usage (/sys/fs/cgroup)"
    return avail, source


def format_bytes(n: int) -> str:
    """`n` bytes as a short decimal string: 512 B, 1.5 kB, 8.8 TB, 1.2e+03 EB."""
    value, units = float(n), ["B", "kB", "MB", "GB", "TB", "PB", "EB"]
    for unit in units[:-1]:
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1000
    return f"{value:.3g} {units[-1]}"


def host_run_bytes(cfg: Config, device: torch.device, obs_dim: int, action_nvec: tuple[int, ...]) -> int:
    """The host bytes a run of `cfg` holds of its own: its `estimate_memory` total on a CPU device (everything
    lives in host memory), 0 on CUDA (the estimate is device memory)."""
    return estimate_memory(cfg, obs_dim, action_nvec).total if torch.device(device).type == "cpu" else 0


def check_memory(
    cfg: Config,
    device: torch.device,
    obs_dim: int,
    action_nvec: tuple[int, ...],
    available: tuple[int | None, str] | None = None,
) -> MemoryEstimate:
    """Raise ValueError when the run's `estimate_memory` exceeds the memory available on `device`
    (`available_memory`, or `available` as (bytes, source) when given), naming each part with the config fields it
    comes from, the estimate and what is available. Returns the estimate; an unreadable amount of available memory
    skips the comparison."""
    est = estimate_memory(cfg, obs_dim, action_nvec)
    free, source = available if available is not None else available_memory(device)
    if free is None or est.total <= free:
        return est
    branches = f"{len(action_nvec)} action branch{'es' if len(action_nvec) != 1 else ''}"
    parts = [
        f"replay {format_bytes(est.replay)} (replay_capacity={cfg.replay_capacity}, obs_dim={obs_dim}, {branches})",
        f"networks {format_bytes(est.nets)} (trunk_hidden={list(cfg.trunk_hidden)}, head_hidden={cfg.head_hidden}: "
        f"{est.params} parameters x {NET_COPIES} copies)",
        f"learner buffers {format_bytes(est.learner)} (batch_size={cfg.batch_size})",
        f"envs {format_bytes(est.envs)} (num_envs={cfg.num_envs}, eval_episodes={cfg.eval_episodes})",
    ]
    raise ValueError(
        f"the run does not fit in {device}'s memory: it needs an estimated {format_bytes(est.total)}, "
        f"{format_bytes(free)} is available ({source}): {'; '.join(parts)}; lower the largest of them"
    )


def window_bytes_per_step(device_type: str, learner_kind: str) -> tuple[int, str]:
    """(host bytes per guarded step of `hotloop gate`'s window, where the figure comes from) for a run on a
    `device_type` ("cpu" / "cuda") device with a `learner_kind` ("hotloop" / "reference") learner: the bound of the
    module docstring, events per step x BYTES_PER_EVENT. Raises ValueError for another device type."""
    if device_type == "cpu":
        events, why = CPU_EVENTS_PER_STEP, "CPU, measured 2948-4962"
    elif device_type == "cuda" and learner_kind == "hotloop":
        events, why = CUDA_GRAPH_EVENTS_PER_STEP, "CUDA graph learner, measured 127 on the H200"
    elif device_type == "cuda":
        events, why = CUDA_EAGER_EVENTS_PER_STEP, "CUDA eager learner, 5 x the CPU bound"
    else:
        raise ValueError(f"no guarded-window estimate for device type {device_type!r} (cpu or cuda)")
    return events * BYTES_PER_EVENT, f"{events} trace events per step ({why}) x {BYTES_PER_EVENT} B"


def estimate_window_memory(steps: int, repeats: int, device_type: str, learner_kind: str) -> int:
    """Host bytes of `hotloop gate`'s guarded windows: `steps` (K) x `repeats` (R) x `window_bytes_per_step`
    (each repeat's report is kept to the end). Python ints: no size is too large to estimate. Raises ValueError as
    window_bytes_per_step does, or for steps or repeats < 1."""
    if steps < 1 or repeats < 1:
        raise ValueError(f"the guarded window needs steps >= 1 and repeats >= 1, got {steps} and {repeats}")
    return steps * repeats * window_bytes_per_step(device_type, learner_kind)[0]


def check_window_memory(
    steps: int,
    repeats: int,
    device: torch.device,
    learner_kind: str,
    run_bytes: int = 0,
    available: tuple[int | None, str] | None = None,
) -> int:
    """Raise ValueError when `hotloop gate`'s guarded windows (`estimate_window_memory`: `steps` x `repeats` x the
    per-step bound), plus `run_bytes` of the run's own that live in host memory (its `estimate_memory` total on a
    CPU device, 0 on CUDA), exceed the host's available memory (`available_memory` of the CPU, or `available` as
    (bytes, source)). The message gives the estimate, its per-step figure and source, what is available and how
    many steps would fit. Returns the window's estimate; an unreadable amount of available memory skips the
    comparison. Raises ValueError as estimate_window_memory does."""
    est = estimate_window_memory(steps, repeats, device.type, learner_kind)
    free, source = available if available is not None else available_memory(torch.device("cpu"))
    if free is None or est + run_bytes <= free:
        return est
    per_step, why = window_bytes_per_step(device.type, learner_kind)
    room = max(0, free - run_bytes) // (per_step * repeats)
    run = f", plus the run's own {format_bytes(run_bytes)} (on the CPU)" if run_bytes else ""
    raise ValueError(
        f"the guarded window does not fit in the host's memory: {steps} steps x {repeats} repeat"
        f"{'s' * (repeats != 1)} x {format_bytes(per_step)} per step ({why}) = an estimated "
        f"{format_bytes(est)}{run}, {format_bytes(free)} is available ({source}); "
        f"{f'at most {room} steps fit' if room else 'not one step fits'} at {repeats} "
        f"repeat{'s' * (repeats != 1)}"
    )
