"""Bring your own events: the ``[input]`` mapping of a stream (formats json, csv, tesla-fleet-telemetry,
gtfs-realtime) and the decoders that turn one raw message into mapped events.

Independent of the engine, its config module and the strategies (the audit decodes the raw topic with it).
"""
from stream_anon.inputs.decode import Decoded, Decoder, decode_file, derived_event_id, file_messages
from stream_anon.inputs.mapping import FORMATS, FieldSpec, InputSpec, input_digest, parse_input

__all__ = ["Decoded", "Decoder", "FORMATS", "FieldSpec", "InputSpec", "decode_file",
           "derived_event_id", "file_messages", "input_digest", "parse_input"]
