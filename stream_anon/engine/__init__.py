"""The anonymization engine (no Kafka, no faust): ``Engine``, its outputs, and batch use on DataFrames."""
from __future__ import annotations

from stream_anon.engine.engine import Engine, get_path
from stream_anon.engine.release import ClassInfo, Rejection, Release, StepResult
from stream_anon.engine.space import QISpace
from stream_anon.engine.batch import anonymize_dataframe, demo_config

__all__ = ["Engine", "Release", "ClassInfo", "Rejection", "StepResult", "QISpace", "anonymize_dataframe",
           "demo_config", "get_path"]
