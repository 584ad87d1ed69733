"""JSON schemas for structured output checks: each one any model can finish under the mask, since every
string, number and array in it is bounded (a length, a pattern, an enum, a range, maxItems). Used by
tests/generation/test_structured.py (every reply parsed and validated with `jsonschema`) and `k3 bench structured`
(the mask's cost per token). Each entry: (name, what it exercises, schema).
"""
from __future__ import annotations

NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 99}

SCHEMAS: list[tuple[str, str, dict]] = [
    ("enum_top", "a top-level enum", {"enum": ["red", "green", "blue"]}),
    ("enum_in_object", "an enum property, no other keys", {
        "type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"],
        "additionalProperties": False}),
    ("enum_unicode", "non-ASCII enum values", {
        "type": "object", "properties": {"city": {"enum": ["北京", "Zürich", "naïve café"]}}, "required": ["city"],
        "additionalProperties": False}),
    ("const", "a const field", {
        "type": "object", "properties": {"version": {"const": 2}, "name": NAME}, "required": ["version", "name"],
        "additionalProperties": False}),
    ("nested_objects", "three levels of required objects", {
        "type": "object", "required": ["a"], "additionalProperties": False, "properties": {"a": {
            "type": "object", "required": ["b"], "additionalProperties": False, "properties": {"b": {
                "type": "object", "required": ["c"], "additionalProperties": False, "properties": {"c": NAME}}}}}}),
    ("array_bounds", "an array of 2 to 4 bounded integers", {
        "type": "array", "items": SMALL_INT, "minItems": 2, "maxItems": 4}),
    ("array_of_objects", "up to 3 objects with required fields", {
        "type": "object", "required": ["people"], "additionalProperties": False, "properties": {"people": {
            "type": "array", "maxItems": 3, "items": {
                "type": "object", "properties": {"name": NAME, "age": SMALL_INT}, "required": ["name", "age"],
                "additionalProperties": False}}}}),
    ("optional_fields", "required and optional properties", {
        "type": "object", "properties": {"name": NAME, "nickname": NAME, "age": SMALL_INT}, "required": ["name"],
        "additionalProperties": False}),
    ("string_pattern", "a string matching a pattern", {
        "type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
        "required": ["code"], "additionalProperties": False}),
    ("string_length", "a string of 3 to 8 characters", {
        "type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 8}}, "required": ["s"],
        "additionalProperties": False}),
    ("string_date", "format: date", {
        "type": "object", "properties": {"day": {"type": "string", "format": "date"}}, "required": ["day"],
        "additionalProperties": False}),
    ("integer_bounds", "an integer in -5..1000", {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 1000}}, "required": ["n"],
        "additionalProperties": False}),
    ("exclusive_bounds", "exclusiveMinimum and exclusiveMaximum", {
        "type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}},
        "required": ["n"], "additionalProperties": False}),
    ("booleans_and_null", "true/false and null", {
        "type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}},
        "required": ["ok", "note"], "additionalProperties": False}),
    ("any_of", "a string or an integer", {
        "type": "object", "properties": {"v": {"anyOf": [NAME, SMALL_INT]}}, "required": ["v"],
        "additionalProperties": False}),
    ("one_of_tagged", "tagged variants by const", {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": SMALL_INT}, "required": ["kind", "r"],
         "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": SMALL_INT},
         "required": ["kind", "side"], "additionalProperties": False}]}),
    ("ref_defs", "$ref to $defs, used twice", {
        "$defs": {"point": {"type": "object", "properties": {"x": SMALL_INT, "y": SMALL_INT}, "required": ["x", "y"],
                            "additionalProperties": False}},
        "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
        "required": ["from", "to"], "additionalProperties": False}),
    ("nullable", "type [string, null]", {
        "type": "object", "properties": {"middle": {"type": ["string", "null"], "maxLength": 12}},
        "required": ["middle"], "additionalProperties": False}),
    ("tuple", "prefixItems with items: false", {
        "type": "array", "prefixItems": [NAME, SMALL_INT, {"type": "boolean"}], "items": False, "minItems": 3}),
    ("tool_arguments", "an OpenAI-style call's arguments: enum, bounds, optional", {
        "type": "object", "properties": {"city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit"], "additionalProperties": False}),
    ("all_of", "allOf of two objects, no other keys", {
        "allOf": [{"type": "object", "properties": {"a": SMALL_INT}, "required": ["a"]},
                  {"type": "object", "properties": {"b": NAME}, "required": ["b"]}],
        "properties": {"a": True, "b": True}, "additionalProperties": False}),
    ("map", "a map of up to 3 bounded integers under short lowercase keys", {
        "type": "object", "patternProperties": {"^[a-z]{1,4}$": SMALL_INT}, "additionalProperties": False,
        "maxProperties": 3}),
]
