"""The anonymization engine (no Kafka, no faust): ``Engine``, its outputs, and batch use on DataFrames."""
from __future__ import annotations

from stream_anon.engine.batch import anonymize_dataframe, demo_config
from stream_anon.engine.engine import ClosedWindow, Engine, event_windows, make_former
from stream_anon.engine.records import RecordReader, Records, get_path
from stream_anon.engine.release import ClassInfo, Rejection, Release, StepResult
from stream_anon.engine.space import QISpace

__all__ = ["Engine", "ClosedWindow", "event_windows", "Release", "ClassInfo", "Rejection", "StepResult", "QISpace", "Records",
           "RecordReader", "anonymize_dataframe", "demo_config", "get_path", "make_former"]
