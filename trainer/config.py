"""Typed training configuration, its presets, and the round trip to plain dicts and JSON.

Style after CleanRL's `Args` dataclass (cleanrl/dqn.py): one field per knob, each with a one-line docstring that
`hotloop train --help` shows. Presets (`PRESETS`) are the only named configurations: `cartpole`, the default,
learns CartPole-v1 with either learner, on a CPU in about a minute or on a GPU in seconds (12,000 learner steps,
spectral norm off: CARTPOLE_LEARNS); `cartpole-fast` is the same run in 24 epochs of 500 learner steps, for timing
to a return of 475, with a wider net (trunk 256-256, heads 64) and lr decaying linearly to a tenth (CARTPOLE_FAST);
`seed-scale` is the shape every perf number is quoted at, spectral norm on every weight matrix (docs/h200_facts.md).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import reprlib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Config:
    """Everything a training run needs; build one with `preset(name)` and `replace_fields`."""

    env: str = "cartpole"
    """environment: `cartpole` (GPU-vectorized CartPole-v1), `synthetic` (seed-scale shapes), `gym:<EnvId>`"""
    num_envs: int = 8
    """environments stepped together as one batch per vectorized env step"""
    seed: int = 1
    """seed of every random generator (torch, env, replay, exploration); 0 <= seed < 2**47 (SEED_LIMIT)"""
    device: str = "auto"
    """`cpu`, `cuda`, `cuda:N`, or `auto` (cuda when available, else cpu)"""
    learner: str = "auto"
    """`hotloop` (flat buffers, fused Triton kernels, CUDA graph), `reference` (plain torch), `auto` (hotloop on cuda)"""
    log_interval: int = 100
    """learner steps between non-blocking metric readbacks (hotloop learner)"""
    epochs: int = 20
    """training epochs; an epoch is `learner_steps_per_epoch` learner steps"""
    learner_steps_per_epoch: int = 1000
    """learner (gradient) steps per epoch"""
    checkpoint_interval: int = 1
    """epochs between checkpoints (checkpoint.pt, written in the background); the last epoch always has one"""
    env_steps_per_update: int = 1
    """vectorized env steps taken before each learner step (each is `num_envs` transitions)"""
    actor_in_step: bool = False
    """hotloop learner with the fused actor and one env step per update: run the env step inside the learner step's
    CUDA graph (one graph per iteration), its main launch on a third stream beside the loss, backward and optimizer,
    once the step has read the replay; the step then samples the transitions of the iterations before (trainer/
    actor.py)"""
    dependent_launch: bool = False
    """hotloop learner: launch the learner step's Triton kernels with Hopper's programmatic dependent launch (PDL: a
    kernel's launch and ramp-up overlap the previous one's last wave; kernels/dependent_launch.py); needs sm_90+.
    Off: it changed the seed-scale step by -2 to +3 us of 361 on an H100 (results/h200/bench/levers/)"""
    grouped_forward: bool = False
    """hotloop learner: the online net on s and both nets on s' in one launch per layer (grid z = 3), one stream.
    Off: 9-11% slower than the two-stream forward at seed scale on an H100 (results/h200/bench/levers/); with it the
    gate's ddqn_overlapped criterion cannot pass (no Double-DQN stream) and no shipped baseline applies"""
    learning_starts: int = 1000
    """transitions collected with the exploration policy before the first learner step"""
    batch_size: int = 128
    """transitions sampled from the replay buffer per learner step; per rank in a data-parallel run (`hotloop train
    --nproc N`: each rank samples its own replay shard; the global batch is batch_size x N)"""
    trunk_hidden: tuple[int, ...] = (64, 64)
    """widths of the shared trunk's hidden layers (one weight matrix each)"""
    head_hidden: int = 32
    """width of the hidden layer of the value head and of every advantage branch"""
    spectral_norm: bool = True
    """spectral-normalize every weight matrix (Miyato et al. 2018), with a learned gain per matrix (Zhai et al. 2023)"""
    sn_power_iterations: int = 1
    """power-iteration steps per training forward for each spectral norm estimate"""
    gamma: float = 0.99
    """discount factor"""
    lr: float = 5e-4
    """Adam learning rate; unchanged by data-parallel runs (the gradient is averaged over the ranks, not summed, so
    an N-rank step is one step on the global batch at this lr: no linear scaling with N)"""
    lr_end_factor: float = 1.0
    """lr at the run's last learner step as a fraction of `lr`, reached linearly (LinearLR's end_factor); 1 = none"""
    adam_eps: float = 1e-8
    """Adam epsilon"""
    weight_decay: float = 0.0
    """Adam (L2) weight decay"""
    max_grad_norm: float = 10.0
    """global grad-norm clip threshold"""
    loss: str = "huber"
    """TD loss: `huber` (smooth L1 with `huber_delta`) or `mse`"""
    huber_delta: float = 1.0
    """Huber loss threshold (TD-error units)"""
    td_target_max: float = 0.0
    """upper clip of every TD target, the most discounted return the rewards allow (r_max / (1 - gamma)); 0 = none"""
    tau: float = 1.0
    """target-network update rate: 1.0 = hard copy, < 1 = Polyak averaging"""
    target_update_interval: int = 100
    """learner steps between target-network updates"""
    replay_capacity: int = 100_000
    """replay buffer capacity (transitions)"""
    per_alpha: float = 0.6
    """priority exponent alpha of proportional PER (0 = uniform)"""
    per_beta_start: float = 0.4
    """importance-sampling exponent beta at the first learner step"""
    per_beta_end: float = 1.0
    """beta reached at the last learner step (linear annealing)"""
    per_eps: float = 1e-6
    """added to |TD error| before exponentiation so no priority is zero"""
    eps_start: float = 1.0
    """epsilon-greedy exploration rate at the first env step"""
    eps_end: float = 0.01
    """exploration rate after the decay"""
    eps_decay_fraction: float = 0.3
    """fraction of the run's env steps over which epsilon decays linearly; in a data-parallel run the env steps are
    each rank's own, so every rank follows the same schedule"""
    cql_weight: float = 0.0
    """weight of the conservative Q-learning logsumexp term (Kumar et al. 2020); 0 = off"""
    diversity_weight: float = 0.0
    """weight of the branch-diversity term (mean pairwise cosine similarity of branch features); 0 = off"""
    eval_episodes: int = 100
    """greedy (epsilon 0) evaluation episodes after each epoch, one per env copy; 0 = no evaluation"""
    obs_dim: int = 64
    """observation size of the `synthetic` env (other envs report their own)"""
    action_nvec: tuple[int, ...] = (4, 4, 4, 4)
    """action-branch sizes of the `synthetic` env (other envs report their own)"""

    def __post_init__(self) -> None:
        for name in ("trunk_hidden", "action_nvec"):
            if isinstance(getattr(self, name), list):
                setattr(self, name, tuple(getattr(self, name)))
        validate(self)

    def total_learner_steps(self) -> int:
        """epochs x learner_steps_per_epoch: the learner steps of the whole run (>= 1), the span of the PER beta's
        annealing and of the lr decay."""
        return self.epochs * self.learner_steps_per_epoch

    def env_shape(self) -> dict[str, Any]:
        """The shape keyword arguments hotloop.trainer.envs.make_env takes from this config (`env_shape_fields`)."""
        return {f: getattr(self, f) for f in env_shape_fields(self.env)}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Config":
        """Inverse of `to_dict`; raises ValueError naming unknown keys."""
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; valid keys: {field_names()}")
        return cls(**data)

    def save(self, path: str | Path) -> None:
        """Write as JSON to `path`, atomically: to a temp file `.<name>.<8 hex>.tmp` in the same folder (created
        O_EXCL, 0666 less the umask; a run folder's leftover temp files are removed at its next start), fsynced,
        then renamed over `path` (os.replace), so that a full disk or a killed process leaves the old file whole (a
        resumed run rewrites its run folder's config.json; a torn one could not be resumed). Raises OSError from
        the file system, the temp file removed and `path` left as it was."""
        import os
        import secrets

        path = Path(path)
        while True:
            tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
                break
            except FileExistsError:
                continue
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(self.to_dict(), indent=2) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        """Read a JSON file written by `save`; raises ValueError naming the file on unreadable or invalid content
        (a missing file, not a regular file (a FIFO, a device such as /dev/zero, a folder), larger than
        hotloop.profiles.input_files.MAX_CONFIG_BYTES (1 MiB; the cap is in the message), not UTF-8, invalid JSON,
        numbers too long to parse, nesting too deep for the parser, not an object) or on a bad field
        (`from_dict`). Read through hotloop.profiles.input_files.read_input_bytes: never blocks, never reads more
        than the cap."""
        from hotloop.profiles.input_files import MAX_CONFIG_BYTES, InputFileError, read_input_bytes

        try:
            data = json.loads(read_input_bytes(path, "config file", MAX_CONFIG_BYTES).decode("utf-8"))
        except InputFileError as exc:
            raise ValueError(f"config file {path}: {exc.problem}") from None
        except RecursionError:
            raise ValueError(
                f"config file {path}: nested too deep to read (JSON arrays/objects nested beyond the "
                f"parser's limit; a config is one flat object)"
            ) from None
        except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError, int digit limit
            raise ValueError(f"config file {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"config file {path}: expected a JSON object, got {type(data).__name__}")
        return cls.from_dict(data)


SEED_LIMIT = 2**47
"""config.seed must be in [0, SEED_LIMIT): every seed derived from it must stay in the range its consumer takes.
The binding one: each epoch's greedy evaluation reseeds its env with seed * 100_003 + epoch
(hotloop.trainer.loop.Trainer.run_epoch), and torch.Generator.manual_seed takes only values below 2**64
(2**64 / 100_003 is about 1.8e14 = 2**47.4; 2**47 leaves room for 4e18 epochs). The others fit then too: the
actor's Philox key seed + 2**40 + its step counter and the learner's seed + step are int64 kernel arguments
(< 2**63), and the env reseed on resume, seed + 7919 * epoch. Negative seeds: the hotloop learner's Philox streams
and Gymnasium's seeding take none."""

_POSITIVE_INTS = (
    "num_envs",
    "epochs",
    "learner_steps_per_epoch",
    "env_steps_per_update",
    "batch_size",
    "head_hidden",
    "sn_power_iterations",
    "target_update_interval",
    "replay_capacity",
    "obs_dim",
    "log_interval",
    "checkpoint_interval",
)
_UNIT_INTERVAL = (
    "gamma",
    "per_beta_start",
    "per_beta_end",
    "eps_start",
    "eps_end",
    "eps_decay_fraction",
    "lr_end_factor",
)


def _check_types(cfg: Config) -> None:
    """ValueError naming the first field whose value has the wrong type (floats must be finite; ints are taken
    for floats; bools are not numbers)."""
    hints = typing.get_type_hints(Config)
    for f in dataclasses.fields(Config):
        value, kind = getattr(cfg, f.name), hints[f.name]
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if kind is bool:
            ok, want = isinstance(value, bool), "a bool (True or False)"
        elif kind is int:
            ok, want = is_int, "an int"
        elif kind is float:
            ok, want = (is_int or isinstance(value, float)) and math.isfinite(value), "a finite float"
        elif kind is str:
            ok, want = isinstance(value, str), "a str"
        else:
            ok = isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            want = "a list of ints"
        if not ok:
            raise ValueError(f"config.{f.name} must be {want}, got {_short_repr(value)}")


def _short_repr(value: object) -> str:
    """repr(value) cut to a readable length (at most 160 characters) and nesting depth (reprlib), for error
    messages about any input."""
    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxlist, r.maxtuple, r.maxlevel = 60, 60, 6, 6, 3
    text = r.repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def validate_run(cfg: Config) -> None:
    """Checks a training run of `cfg` needs beyond `validate` (which every Config passes, also those that only
    build a learner or a replay in tests): ValueError when config.learning_starts exceeds config.replay_capacity
    (the replay cannot hold the transitions collected before the first learner step: the prefill would overwrite
    its own first ones, so the setting cannot mean what it says). The CLI calls it before training
    (hotloop.guards.commands.checks.check_run)."""
    if cfg.learning_starts > cfg.replay_capacity:
        raise ValueError(
            f"config.learning_starts ({cfg.learning_starts}) exceeds config.replay_capacity "
            f"({cfg.replay_capacity}): the replay cannot hold the transitions collected before the "
            f"first learner step; lower learning_starts or raise replay_capacity"
        )


def validate(cfg: Config) -> None:
    """Raise ValueError naming the first field whose value has the wrong type or is out of range."""
    _check_types(cfg)
    if not 0 <= cfg.seed < SEED_LIMIT:
        raise ValueError(
            f"config.seed must be in [0, 2**47) = [0, {SEED_LIMIT - 1}], got {_short_repr(cfg.seed)}: "
            f"the per-epoch evaluation seeds its env with seed * 100003 + epoch, which "
            f"torch.Generator.manual_seed takes only below 2**64, and the actor's Philox key is seed + "
            f"2**40 + its step counter, an int64 (hotloop.trainer.config.SEED_LIMIT)"
        )
    for name in _POSITIVE_INTS:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"config.{name} must be a positive int, got {value!r}")
    for name in _UNIT_INTERVAL:
        value = getattr(cfg, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"config.{name} must be in [0, 1], got {value!r}")
    if cfg.learning_starts < 0:
        raise ValueError(f"config.learning_starts must be >= 0, got {cfg.learning_starts!r}")
    if not 0.0 < cfg.tau <= 1.0:
        raise ValueError(f"config.tau must be in (0, 1], got {cfg.tau!r}")
    for name in ("lr", "adam_eps", "max_grad_norm", "huber_delta", "per_eps"):
        if not getattr(cfg, name) > 0:
            raise ValueError(f"config.{name} must be > 0, got {getattr(cfg, name)!r}")
    for name in ("weight_decay", "per_alpha", "cql_weight", "diversity_weight", "eval_episodes", "td_target_max"):
        if not getattr(cfg, name) >= 0:
            raise ValueError(f"config.{name} must be >= 0, got {getattr(cfg, name)!r}")
    _check_per_floor(cfg.per_eps, cfg.per_alpha)
    if cfg.learner not in ("auto", "hotloop", "reference"):
        raise ValueError(f"config.learner must be 'auto', 'hotloop' or 'reference', got {cfg.learner!r}")
    if cfg.loss not in ("huber", "mse"):
        raise ValueError(f"config.loss must be 'huber' or 'mse', got {cfg.loss!r}")
    if not cfg.trunk_hidden or any(w < 1 for w in cfg.trunk_hidden):
        raise ValueError(f"config.trunk_hidden must be non-empty positive widths, got {cfg.trunk_hidden!r}")
    if not cfg.action_nvec or any(n < 2 for n in cfg.action_nvec):
        raise ValueError(f"config.action_nvec must be non-empty sizes >= 2, got {cfg.action_nvec!r}")
    if cfg.batch_size > cfg.replay_capacity:
        raise ValueError(f"config.batch_size ({cfg.batch_size}) exceeds config.replay_capacity ({cfg.replay_capacity})")


_F32_TINY, _F32_MAX = 2.0**-126, float.fromhex("0x1.fffffep+127")
"""float32's smallest normal and largest finite value (_F32_TINY is hotloop.kernels.sum_tree.PRIORITY_FLOOR)."""


def _check_per_floor(per_eps: float, per_alpha: float) -> None:
    """ValueError unless per_eps and per_eps ** per_alpha (the priority of a zero TD error) are normal float32
    values, in [2^-126, float32 max]: else a zero TD error's priority underflows to 0 in float32 (the tree would
    store its 2^-126 floor instead) or overflows to inf (sanitized). Both fields must already be > 0 resp. >= 0."""
    normal = f"float32's normal range [{_F32_TINY!r}, {_F32_MAX!r}]"
    if not _F32_TINY <= per_eps <= _F32_MAX:
        raise ValueError(f"config.per_eps must be within {normal}, got {per_eps!r}")
    try:
        value = per_eps**per_alpha
    except OverflowError:
        value = math.inf
    if not _F32_TINY <= value <= _F32_MAX:
        raise ValueError(
            f"config.per_eps ** config.per_alpha = {per_eps!r} ** {per_alpha!r} = {value!r} must be "
            f"within {normal}: a zero TD error's priority would {'underflow' if value < 1 else 'overflow'}"
            " float32"
        )


def field_names() -> list[str]:
    """Names of all Config fields, in declaration order."""
    return [f.name for f in dataclasses.fields(Config)]


def field_docs() -> dict[str, str]:
    """Field name -> its one-line docstring (read from this module's source)."""
    import inspect

    tree = ast.parse(inspect.getsource(Config))
    body = tree.body[0].body
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = str(nxt.value.value)
    return docs


ENV_SHAPE_FIELDS = ("obs_dim", "action_nvec")
"""Config fields that only the `synthetic` env reads: every other env reports its own shapes."""


def env_shape_fields(env: str) -> tuple[str, ...]:
    """The Config fields that shape env `env` (a Config.env value): ENV_SHAPE_FIELDS for `synthetic`, none else."""
    return ENV_SHAPE_FIELDS if env == "synthetic" else ()


CARTPOLE_LEARNS: dict[str, Any] = dict(
    num_envs=64,
    lr=7e-4,
    spectral_norm=False,
    tau=0.05,
    target_update_interval=1,
    max_grad_norm=1.0,
    eps_decay_fraction=0.1,
    td_target_max=100.0,
)
"""The settings that learn CartPole-v1 with both learners: Polyak averaging every step, clip 1, 64 envs, epsilon
over 10% of the run, no spectral norm, which with its learned gains kept the Q-values too small, too long
(results/cpu/learning_causes/README.md: the reference solved 6 of 6 seeds with these settings, 0 of 6 with
spectral norm on, and the former default, spectral norm on with a hard target copy every 100 steps, 1 of 3), and
the TD target clipped to 100, the most a reward of 1 per step discounts to at gamma 0.99 (1 / (1 - 0.99)): the
runs that fail without it overestimate past that bound and some diverge (H7, H8 of the same notes).
First found by the CPU sweep results/cpu/cartpole_sweep/ and the GPU sweep
results/h200/device/cartpole_sweep_hot.sh."""

CARTPOLE_FAST: dict[str, Any] = dict(
    CARTPOLE_LEARNS,
    epochs=24,
    learner_steps_per_epoch=500,
    trunk_hidden=(256, 256),
    head_hidden=64,
    lr_end_factor=0.1,
)
"""The fast preset: CARTPOLE_LEARNS in 24 epochs of 500 learner steps, a trunk of 256-256 with heads of 64 (reaches 475
sooner: 26 of 26 seeds at constant lr, but 4 of 26 held) and lr decaying linearly to 0.1 of 7e-4 over the run (holds
it: 25 of 26 seeds reached and 25 of 26 held on the H200; trunk 64-64 with the same decay reached on 20 of 26), chosen
over seeds 1-26 by results/h200/learning/fast_preset_width/."""

SEED_SCALE_CHECKPOINT_INTERVAL = 10
"""The seed-scale preset's checkpoint_interval. Its checkpoint holds 582,869,096 bytes of tensors (the replay's
2^20 transitions: obs and next_obs 2 x 268,435,456, actions 25,165,824, rewards and terminal flags 2 x 4,194,304,
the sum tree 8,388,608; the learner with Adam ~4 MB): every epoch that was ~583 MB written per epoch (~117 GB over
the seed's 200 epochs), at 10 it is ~58 MB per epoch (~12 GB), and a kill loses at most 10 epochs (about 6 s of
loop time on an H200) plus the write in flight. Each epoch's 8.2 M new transitions overwrite the whole replay, so
append-only chunks would not save bytes there."""

PRESETS: dict[str, dict[str, Any]] = {
    "cartpole": dict(CARTPOLE_LEARNS, epochs=12),
    "cartpole-fast": CARTPOLE_FAST,
    "seed-scale": dict(
        env="synthetic",
        num_envs=8192,
        batch_size=8192,
        obs_dim=64,
        action_nvec=(4, 4, 4),
        trunk_hidden=(512, 256),
        head_hidden=80,
        replay_capacity=2**20,
        learner_steps_per_epoch=1000,
        learning_starts=8192,
        epochs=3,
        target_update_interval=1000,
        eps_decay_fraction=0.5,
        eval_episodes=0,
        checkpoint_interval=SEED_SCALE_CHECKPOINT_INTERVAL,
    ),
}


def preset(name: str, **overrides: Any) -> Config:
    """The named preset with `overrides` applied; raises ValueError for an unknown name or field."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return Config.from_dict({**PRESETS[name], **overrides})


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one `key=value` override (value as a Python literal, else a string); ValueError if malformed.
    An int field (and each width of a list-of-ints field) also takes an integral float such as 1e6, as an int."""
    if "=" not in text:
        raise ValueError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip().replace("-", "_")
    if key not in field_names():
        raise ValueError(f"override {text!r}: unknown config key {key!r}; valid keys: {field_names()}")
    expected = type(getattr(Config(), key))
    if expected is bool and raw.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return key, raw.strip().lower() in ("true", "1", "yes")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
        value = raw
    if expected is tuple and isinstance(value, (int, float, list)):
        value = tuple(value) if isinstance(value, list) else (value,)
    if expected is tuple and isinstance(value, tuple):
        value = tuple(_integral(v) for v in value)
    if expected is int:
        value = _integral(value)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected):
        raise ValueError(f"override {text!r}: {key} takes a {expected.__name__}, got {type(value).__name__}")
    return key, value


def _integral(value: Any) -> Any:
    """A finite float with no fractional part (1e6, 32.0) as an int; anything else unchanged."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value
