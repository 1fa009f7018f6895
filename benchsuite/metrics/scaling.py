"""Scaling efficiency across the records of one sweep (DESIGN.md "Metrics").

weak   = throughput(N) / (N × throughput(1))
strong = time(1) / (N × time(N))
both against the 1-device run of the same sweep; null when that run is missing or failed.
"""

from __future__ import annotations

import pandas as pd


def add_scaling_efficiency(df: pd.DataFrame) -> pd.DataFrame:
    """Adds `scaling_efficiency` (and `scaling_baseline_run_key`) to a records DataFrame."""
    df = df.copy()
    df["scaling_efficiency"] = None
    df["scaling_baseline_run_key"] = None
    if df.empty or "sweep_id" not in df:
        return df
    ok = df["status"] == "ok"
    for _, group in df[ok].groupby("sweep_id"):
        base = group[group["world_size"] == 1]
        if base.empty:
            continue
        b = base.iloc[0]
        for idx, row in group.iterrows():
            n = row["world_size"]
            if row["scaling"] == "strong":
                eff = b["step_time_median_s"] / (n * row["step_time_median_s"])
            else:
                eff = row["tokens_per_s"] / (n * b["tokens_per_s"])
            df.at[idx, "scaling_efficiency"] = float(eff)
            df.at[idx, "scaling_baseline_run_key"] = b["run_key"]
    df["scaling_efficiency"] = pd.to_numeric(df["scaling_efficiency"])
    return df
