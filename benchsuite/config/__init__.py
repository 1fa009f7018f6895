"""Suite files read into runs, with their section types, field specs, key rules and run keys.

Every mistake in a file is collected and reported together (file, key path, reason), so a user fixes a suite
in one pass and nothing is launched for an invalid one. The package reads nothing but the suite and imports
nothing of benchsuite but benchsuite.record; the checks that open token files and codecarbon's data are
preflight.py's, which every verb that runs or reads a suite calls (`preflight.load_suite`).
"""

from benchsuite.config.names import name_problem, name_skeleton
from benchsuite.config.problems import ConfigError
from benchsuite.config.ranks import RANKS_PER_CORE, check_ranks_per_node, usable_cores
from benchsuite.config.sections import (SECTIONS, CarbonConfig, EnergyConfig, ModelConfig, MoEConfig, ParallelConfig,
                                        RunConfig, TrainConfig, later_keys)
from benchsuite.config.specs import build_section, non_negative, one_of, positive, spec
from benchsuite.config.suite import MAX_RUNS, TOP_KEYS, Suite, load_suite, parse_suite
from benchsuite.config.sweeps import SWEEP_KEYS

__all__ = ["MAX_RUNS", "RANKS_PER_CORE", "SECTIONS", "SWEEP_KEYS", "TOP_KEYS", "CarbonConfig", "ConfigError",
           "EnergyConfig", "ModelConfig", "MoEConfig", "ParallelConfig", "RunConfig", "Suite", "TrainConfig",
           "build_section", "check_ranks_per_node", "later_keys", "load_suite", "name_problem",
           "name_skeleton", "non_negative", "one_of", "parse_suite", "positive", "spec", "usable_cores"]
