"""benchsuite: what training a transformer really costs.

`benchsuite.load(DIR)` (one row per record), `benchsuite.load_runs(DIR)` (one row per run) and
`benchsuite.load_steps(DIR)` (one row per measured step) read a results folder into pandas DataFrames (benchsuite/results/api.py); they are imported on first use, so `import benchsuite`
stays light.
"""

__all__ = ["load", "load_runs", "load_steps"]


def __getattr__(name: str):
    if name in __all__:
        from benchsuite.results import api

        return getattr(api, name)
    raise AttributeError(f"module 'benchsuite' has no attribute {name!r}")
