"""Suite files read into runs (their sections are the record's types), with key rules and run keys.

Every mistake in a file is collected and reported together (file, key path, reason), so a user fixes a suite
in one pass and nothing is launched for an invalid one. The package reads nothing but the suite and imports
nothing of benchsuite but benchsuite.record; the checks that open token files and codecarbon's data are
preflight.py's, which every verb that runs or reads a suite calls (`preflight.load_suite`).
"""

from benchsuite.config.names import name_problem, name_skeleton
from benchsuite.config.problems import ConfigError
from benchsuite.config.ranks import RANKS_PER_CORE, check_ranks_per_node, usable_cores
from benchsuite.config.run import RunConfig
from benchsuite.config.specs import build_section, doc_of
from benchsuite.config.suite import MAX_RUNS, TOP_KEYS, Suite, load_suite, parse_suite
from benchsuite.config.sweeps import SWEEP_KEYS
from benchsuite.record.sections import (SECTIONS, CarbonConfig, EnergyConfig, ModelConfig, MoEConfig, ParallelConfig,
                                        TrainConfig)

__all__ = ["MAX_RUNS", "RANKS_PER_CORE", "SECTIONS", "SWEEP_KEYS", "TOP_KEYS", "CarbonConfig", "ConfigError",
           "EnergyConfig", "ModelConfig", "MoEConfig", "ParallelConfig", "RunConfig", "Suite", "TrainConfig",
           "build_section", "check_ranks_per_node", "doc_of", "load_suite", "name_problem", "name_skeleton",
           "parse_suite", "usable_cores"]
