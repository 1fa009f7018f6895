"""benchsuite: what training a transformer really costs.

`benchsuite.load(DIR)` (one row per record), `benchsuite.load_runs(DIR)` (one row per run) and
`benchsuite.load_steps(DIR)` (one row per measured step) read a results folder into pandas DataFrames
(benchsuite/results/api.py); `benchsuite.measure(name, ...)` measures your own training loop into a record
of the same schema (benchsuite/measuring.py). They are imported on first use, so `import benchsuite` stays light.
"""

__all__ = ["load", "load_runs", "load_steps", "measure", "Measurement", "Window"]


def __getattr__(name: str):
    if name in ("load", "load_runs", "load_steps"):
        from benchsuite.results import api

        return getattr(api, name)
    if name in ("measure", "Measurement", "Window"):
        from benchsuite import measuring

        return getattr(measuring, name)
    raise AttributeError(f"module 'benchsuite' has no attribute {name!r}")
