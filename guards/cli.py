"""hotloop.guards.cli: the stable name of the `hotloop` command, kept for what calls it by that name (pyproject.toml's
console script, `python -m hotloop.guards.cli ...` in ci/gate.sh, the README, the tests, the device scripts and the
gate runs of hotloop.guards.mutate and hotloop.guards.learning_report). The command lives in hotloop.guards.commands
(`main`: hotloop.guards.commands.main, whose docstring lists the exit codes)."""

import sys

from hotloop.guards.commands.main import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
