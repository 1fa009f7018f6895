"""Readers: a results folder read once into typed records and the results model (runs, seeds, repeats), and the views over it: report, compare, verdicts, export, load()."""
