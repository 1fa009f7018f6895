"""The run record, assembled on rank 0 from every rank's RankResult and the run's RunFacts, one way for the
harness's runs and for a user's own loop. The worker calls harness_record (harness.py), benchsuite.measure()
calls user_record (user.py).

Each rank measures its own figures (RankResult, gathered to rank 0); what holds for the whole run (the
resolved precision, what parallelize applied, the peak FLOP/s, the backend) is known on rank 0 and never
gathered (RunFacts). Per-step time is the slowest rank's: a step ends when every rank is done. The parts
every record has are written once (sections.py); the record comes out typed (record.Record), flagged by
the sanity checks.
"""

from benchsuite.assembly.harness import harness_record
from benchsuite.assembly.inputs import RankQuality, RankResult, RunFacts, Stamp, UserLoop
from benchsuite.assembly.user import user_record

__all__ = ["RankQuality", "RankResult", "RunFacts", "Stamp", "UserLoop", "harness_record", "user_record"]
