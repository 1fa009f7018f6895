"""FP8 training, prediction only (`benchsuite predict --precision fp8`): the harness trains in fp32 or bf16.

The weight matmuls run at the system's device.fp8_matmul_tflops (compute.py, moe.py); the attention core,
the router and the LM head stay in bf16. What FP8 adds is its casts, memory-bound (Transformer Engine's
per-tensor recipe: read bf16, write FP8, 3 bytes per element):

    casts = 3·(Σ_GEMMs (K + N) · rows) / B  +  3·Ψ / B

each GEMM of a K × N weight casts its input (K per row) in forward and its output gradient (N per row) in
backward, over the rows it runs (the device's tokens; the routed rows for the experts); the weights Ψ of
the device are cast once per step (cached over its micro-batches). B: the device's memory bandwidth.
"""

from __future__ import annotations

from benchsuite.metrics.flops import param_counts
from benchsuite.predict.moe import rows_per_device, stage_moe_layers
from benchsuite.predict.system import System
from benchsuite.predict.workload import Workload

CAST_BYTES = 3  # read 2 (bf16), write 1 (FP8)


def cast_elements_per_row(k: int, n: int) -> int:
    """A K × N weight's GEMM: its input cast in forward, its output gradient in backward."""
    return k + n


def fp8_casts_s(w: Workload, system: System, psi: float) -> float:
    """Seconds of one step's FP8 casts on one device (module docstring); 0 unless w.fp8."""
    if not w.fp8:
        return 0.0
    m, lay = w.model, w.layout
    mats = 3 if m.activation == "swiglu" else 2
    q, kv = m.heads * m.dim_head, m.n_kv_heads * m.dim_head
    attention = cast_elements_per_row(m.hidden, q + 2 * kv) + cast_elements_per_row(q, m.hidden)

    def ffn(width: int) -> int:
        return cast_elements_per_row(m.hidden, (mats - 1) * width) + cast_elements_per_row(width, m.hidden)

    n_moe = param_counts(m, w.moe).moe_layers
    dense_rows = w.micro_batch * m.seq_len / (lay.tp * lay.pp)
    per_micro = dense_rows * (m.layers * attention + (m.layers - n_moe) * ffn(m.ffn))
    if w.moe is not None:
        width = w.moe.expert_hidden or m.ffn
        per_micro += stage_moe_layers(w) * rows_per_device(w) * ffn(width)
        per_micro += dense_rows * n_moe * w.moe.shared_experts * ffn(width)
    bw = system.device.memory_gbps * 1e9
    return CAST_BYTES * (w.microbatches * per_micro + psi) / bw
