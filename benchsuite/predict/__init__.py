"""Predict what cannot be run here: step time by component, memory per device, energy and CO2e of a
training run at cluster scale, from a suite's runs and a system file (`benchsuite predict`)."""

from benchsuite.predict.step import Component, Prediction, predict, predict_run
from benchsuite.predict.system import System, load_system

__all__ = ["Component", "Prediction", "System", "load_system", "predict", "predict_run"]
