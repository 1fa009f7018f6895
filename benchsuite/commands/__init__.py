"""The verbs of the `benchsuite` command, one module each (as asv's commands/): `add_parser(sub)`
declares the verb's arguments and sets `fn`, the function that runs it (`run(args) -> int`, the exit
code; carbon's two sub-verbs: `estimate` and `project`). What the verbs share is in common.py."""

from benchsuite.commands import (carbon, compare, dashboard, export, flops, listing, memory, predict, report, run,
                                 schema, slurm, tokenize)

# --help's order
VERBS = (run, listing, report, dashboard, compare, slurm, carbon, export, tokenize, flops, memory, predict, schema)
