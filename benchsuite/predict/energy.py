"""Energy of a step and of a whole training run, from device power at the step's utilisation.

Model, stated: a device draws its idle power plus (full-load − idle) × the share of the step it computes
(compute time / step time; waiting for a collective or a pipeline neighbour is counted as idle). The
devices' energy alone (no host CPUs, memory or network); the facility's PUE and the grid's intensity
come from the run's [carbon] section (energy.carbon), as a measured record's do.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchsuite.energy.carbon import carbon_section


@dataclass(frozen=True)
class EnergyPrediction:
    device_w: float  # per device, at the step's utilisation
    utilisation: float  # compute time / step time
    step_j: float  # all devices, one step
    j_per_token: float
    run_tokens: float
    run_s: float
    run_energy_j: float  # devices only (IT energy)
    run_facility_j: float  # run_energy_j × PUE
    pue: float
    intensity_g_per_kwh: float
    intensity_source: str
    run_co2e_g: float


def predict_energy(*, step_s: float, compute_s: float, devices: int, tokens_per_step: int, idle_w: float,
                   max_w: float, run_tokens: float, carbon) -> EnergyPrediction:
    """carbon: the run's CarbonConfig (PUE, intensity or country)."""
    utilisation = min(1.0, compute_s / step_s)
    watts = idle_w + (max_w - idle_w) * utilisation
    step_j = watts * devices * step_s
    j_per_token = step_j / tokens_per_step
    run_j = j_per_token * run_tokens
    c = carbon_section(run_j, carbon)
    return EnergyPrediction(device_w=watts, utilisation=utilisation, step_j=step_j, j_per_token=j_per_token,
                            run_tokens=run_tokens, run_s=run_tokens / tokens_per_step * step_s, run_energy_j=run_j,
                            run_facility_j=run_j * c["pue"], pue=c["pue"], intensity_g_per_kwh=c["intensity_g_per_kwh"],
                            intensity_source=c["intensity_source"], run_co2e_g=c["co2e_g"])
