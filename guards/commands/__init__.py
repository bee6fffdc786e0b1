"""hotloop.guards.commands: the application layer, the `hotloop` command. One module per subcommand (train, gate,
bench, inspect, report, nsys, mutate, learning), each a thin parse -> call of a library function with a typed
options object; main (`main`: parse, dispatch, exit codes), errors (the exit codes, the reports of a crash and of
Ctrl-C), checks and config_args (the checks and options train, gate and bench share). Nothing outside this folder
imports it, but hotloop.guards.cli, the command's stable name (tests/test_layout.py)."""
