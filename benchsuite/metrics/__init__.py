"""Figures from a run's parts: FLOPs and MFU/HFU with the peak table, the matmul ceiling, memory, communication, timing statistics, training quality, energy per unit of work."""
