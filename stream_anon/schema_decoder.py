"""A kind's JSON Schema as a msgspec type: a batch of payloads decoded and checked in C, straight to columns.

The worker's usual batch is payloads of one producer, each a JSON object holding every property of the kind's
schema. :func:`compile_schema_decoder` turns a flat object schema (every property a scalar described by ``type``,
``const``, ``enum``, ``minLength``, ``pattern``) into a ``msgspec.Struct`` with every property required and no
other key allowed; decoding a payload into it parses the JSON and checks the schema but its ``pattern`` keywords
in one pass, a third of the CPU of parsing to a dict and checking its columns (``bench/bench_input_checks.py``).
A ``pattern`` is left to the caller's column check (:func:`stream_anon.events.decoded_columns`: once per distinct
text of the column; msgspec runs a regular expression per value, ~40% of the decoding).

With that check the decoder is sound, not complete, like :func:`stream_anon.events.compile_schema`: a batch it
decodes is a batch :func:`stream_anon.worker.input_checks.parse_payloads` and the schema accept, with the same values
(tested against them on mutated payloads); any payload it does not decode (an absent property, a JSON integer outside orjson's
int64 range, ``1.0`` where an integer is expected, malformed JSON) sends the whole batch to those general checks,
which name each reason. Schemas outside that shape (the vehicle schema's objects and numbers) raise
``NotImplementedError`` and keep the general path.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Annotated, Literal, Union

import msgspec

# orjson (the general path's parser) reads JSON integers in [-2**63, 2**64 - 1] as int and others as float;
# msgspec bounds fit int64: the decoder accepts int64 only, so an integer it gives is the value orjson gives
_INT = Annotated[int, msgspec.Meta(ge=-(2 ** 63), le=2 ** 63 - 1)]
_SCALARS = {"string": str, "null": type(None), "boolean": bool, "integer": _INT}
_PROPERTY_KEYWORDS = {"type", "const", "enum", "minLength", "pattern", "title", "description"}
# top-level keywords of an object schema that a batch of complete events (every property, no other key) meets
_ROW_KEYWORDS = {"type", "required", "properties", "additionalProperties", "$schema", "$id", "title", "description"}


def row_properties(schema: dict) -> dict:
    """The properties of an object schema that a batch of complete events decides row-wise: at least two, and
    ``required`` among them (NotImplementedError otherwise)."""
    if not isinstance(schema, dict) or set(schema) - _ROW_KEYWORDS or schema.get("type", "object") != "object":
        raise NotImplementedError("not an object schema of properties")
    props = schema.get("properties") or {}
    if len(props) < 2 or not set(schema.get("required", ())) <= set(props):
        raise NotImplementedError("required keys beyond the properties, or fewer than two properties")
    return props


def _property_type(schema: dict):
    """The msgspec type of one property's schema without its ``pattern`` (NotImplementedError outside the
    supported shape)."""
    if not isinstance(schema, dict) or set(schema) - _PROPERTY_KEYWORDS:
        raise NotImplementedError(f"property schema {schema!r}")
    if "const" in schema or "enum" in schema:
        if set(schema) & {"type", "minLength", "pattern"} or ("const" in schema and "enum" in schema):
            raise NotImplementedError("const or enum combined with other keywords")
        values = [schema["const"]] if "const" in schema else list(schema["enum"])
        texts = tuple(v for v in values if v is not None)
        if not texts or not all(type(v) is str for v in texts):
            raise NotImplementedError("const or enum of other values than text and null")
        literal = Literal[texts]  # type: ignore[valid-type]  # built at run time for msgspec; mypy checks static ones
        return Union[literal, None] if None in values else literal
    if "type" not in schema:
        raise NotImplementedError("a property of any type")
    names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if not names or set(names) - set(_SCALARS):
        raise NotImplementedError(f"types {names}")
    members = []
    for name in dict.fromkeys(names):
        kind = _SCALARS[name]
        if kind is str and "minLength" in schema:
            kind = Annotated[str, msgspec.Meta(min_length=schema["minLength"])]
        members.append(kind)
    return members[0] if len(members) == 1 else Union[tuple(members)]


def compile_schema_decoder(schema: dict):
    """For a flat object schema: ``payloads -> columns or None``. When every payload is a JSON object holding exactly
    the schema's properties, each valid but for ``pattern`` (the caller's to check), the result is the columns
    (property name -> tuple of the values, in payload order), equal to what
    :func:`stream_anon.events.compile_schema_columns` gives for the parsed payloads; otherwise None. Raises
    ``NotImplementedError`` for a schema outside that shape (see the module docstring)."""
    props = row_properties(schema)
    names = tuple(props)
    fields = [(f"f{i}", _property_type(props[name])) for i, name in enumerate(names)]
    struct = msgspec.defstruct("SchemaEvent", fields, forbid_unknown_fields=True, gc=False,
                               rename={f: name for (f, _), name in zip(fields, names)})
    decode = msgspec.json.Decoder(struct).decode
    # one C-level pass per field: half the cost of transposing the rows with zip(*rows)
    getters = [(name, attrgetter(f)) for name, (f, _) in zip(names, fields)]

    def columns(payloads: list) -> dict | None:
        if not payloads:
            return {name: () for name in names}
        try:
            rows = list(map(decode, payloads))
        except Exception:   # noqa: BLE001 - any payload not decoded: the general checks decide and name why
            return None
        return {name: tuple(map(get, rows)) for name, get in getters}
    return columns
