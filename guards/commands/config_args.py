"""The options that choose a run's config, shared by `hotloop train`, `gate` and `bench`: the parser's arguments
(`add_run_args`, `config_epilog`) and the typed choice they make (`ConfigChoice`), which builds the Config."""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass
from pathlib import Path

from hotloop.trainer.config import PRESETS, Config, field_docs, parse_override, preset


def config_epilog() -> str:
    """The help text listing every config key for --set KEY=VALUE, with its default (the cartpole preset's) and
    its documentation (hotloop.trainer.config.field_docs)."""
    lines = ["config keys for --set KEY=VALUE (defaults are the cartpole preset):"]
    defaults = Config()
    for name, doc in field_docs().items():
        lines.append(f"  {name} = {getattr(defaults, name)!r}")
        lines.extend(textwrap.wrap(doc, 90, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Add the options of `hotloop train` and `hotloop gate` that choose the config (`ConfigChoice`), the run folder
    (--out), the hang watchdog's limit (--epoch-timeout) and the progress bar (--no-progress) to `p`."""
    p.add_argument("--preset", choices=sorted(PRESETS), help="named configuration (default cartpole)")
    p.add_argument("--epochs", type=int, help="override the preset's number of epochs")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto (default: the preset's, auto)")
    p.add_argument("--seed", type=int, help="override the preset's seed")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config field (repeatable); keys below",
    )
    p.add_argument(
        "--config", type=Path, help="start from a config JSON (as written to a run folder) instead of a preset"
    )
    p.add_argument("--out", type=Path, help="run folder (default: runs/<UTC timestamp>/ under the working directory)")
    p.add_argument(
        "--epoch-timeout",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="hang watchdog: an epoch longer than this dumps all stacks and exits 3 (default 900; at "
        "most threading.TIMEOUT_MAX, about 292 years on Linux)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


@dataclass(frozen=True)
class ConfigChoice:
    """The config an invocation asks for: a config file (`config`) or else a preset (`preset`, default cartpole),
    then the --set overrides ("KEY=VALUE" texts, in order) and the explicit --epochs, --device and --seed (None:
    not given)."""

    preset: str | None
    config: Path | None
    overrides: tuple[str, ...]
    epochs: int | None
    device: str | None
    seed: int | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ConfigChoice:
        """The choice of parsed `args` (preset, config, overrides, epochs, device, seed)."""
        return cls(args.preset, args.config, tuple(args.overrides), args.epochs, args.device, args.seed)

    def build(self) -> Config:
        """The Config chosen; raises ValueError on any bad value (a key, a value, a config file)."""
        base = Config.load(self.config).to_dict() if self.config else preset(self.preset or "cartpole").to_dict()
        for text in self.overrides:
            key, value = parse_override(text)
            base[key] = value
        for key in ("epochs", "device", "seed"):
            if getattr(self, key) is not None:
                base[key] = getattr(self, key)
        return Config.from_dict(base)
