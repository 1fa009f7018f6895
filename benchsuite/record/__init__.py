"""The record layer, at the bottom of the house: the record's types, its encoding, its names and the
small helpers every layer uses (values, sanity rules). Nothing here imports torch, pandas or any
other part of benchsuite."""

from benchsuite.record.codec import (NewerRecordError, RecordError, as_record, decode, encode, failed_record,
                                     to_dict, utc_now, validate)
from benchsuite.record.io import write_record
from benchsuite.record.names import record_filename, record_id, repeat_of, slug
from benchsuite.record.types import SCHEMA_VERSION, Record

__all__ = ["SCHEMA_VERSION", "NewerRecordError", "Record", "RecordError", "as_record", "decode", "encode",
           "failed_record", "record_filename", "record_id", "repeat_of", "slug", "to_dict", "utc_now", "validate",
           "write_record"]
