"""benchsuite.measure() inside the training loops people use: a Hugging Face Trainer callback.

Optional: importing this module needs transformers (`pip install transformers`); `import benchsuite` never
imports it. A Lightning Callback would be the same dozen lines over Lightning's hooks (on_train_start,
on_train_batch_start/end, on_train_end); it is not here because Lightning is not installed where
benchsuite is tested, and an adapter no test runs is one nobody knows works.
"""

from __future__ import annotations

from transformers import TrainerCallback

from benchsuite.measuring import Measurement, measure


class MeasureCallback(TrainerCallback):
    """`Trainer(..., callbacks=[MeasureCallback("my-run", flops_per_token=...)])`: the training measured
    as `with benchsuite.measure(...)` would, one step per optimizer step. Each step is a window of its own
    (on_step_begin to on_step_end), so the Trainer's evaluation and checkpointing between steps is in no
    step's time; it is in the record's energy (the Trainer has no hook before an evaluation). A step's
    tokens are the Trainer's count (TrainingArguments(include_num_input_tokens_seen=True): every process's
    tokens), else measure()'s tokens_per_step. Every process of the job runs it; the main one writes the
    record. The keyword arguments are measure()'s."""

    def __init__(self, name: str, **measure_kwargs):
        self._name, self._kwargs = name, measure_kwargs
        self.measurement: Measurement = measure(name, **measure_kwargs)  # checked now, before training starts
        self._used = False
        self._seen = 0

    def on_train_begin(self, args, state, control, **kwargs):
        """Each train() is a job of its own, measured by a fresh Measurement: another repeat of the run."""
        if self._used:
            self.measurement = measure(self._name, **self._kwargs)
        self._used = True
        self._seen = state.num_input_tokens_seen
        self.measurement.start()

    def on_step_begin(self, args, state, control, **kwargs):
        self.measurement.begin_step()

    def on_step_end(self, args, state, control, **kwargs):
        tokens, self._seen = state.num_input_tokens_seen - self._seen, state.num_input_tokens_seen
        self.measurement.step(tokens=tokens or None)  # 0: the Trainer does not count tokens

    def on_train_end(self, args, state, control, **kwargs):
        self.measurement.stop()
