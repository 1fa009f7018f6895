"""Energy windows per rank (NVML, RAPL, codecarbon's estimate), their bounds, attribution across ranks, and carbon (intensity, PUE, CO2e and the footprint's other parts)."""
