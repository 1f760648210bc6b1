#!/usr/bin/env python3
"""JSON Schema fixtures for the schema-to-grammar compiler
(runtime/grammar/json_schema.c), labelled by the jsonschema package.

Writes tests/fixtures/json_schema/cases.json:
  "cases": each {name, schema, valid: [...], invalid: [...]} where every
    document is JSON text and the split into valid / invalid is what
    jsonschema's Draft202012Validator with its FormatChecker says (the
    candidates below are written by hand; the labels are not).  Documents
    are written the way the compiled grammar writes JSON: object keys in the
    schema's property order, whitespace between tokens none, one space, or a
    newline and up to 20 spaces (json.dumps with indent=2, small depths),
    integers without a fraction, no exponents under a numeric range, strings
    without escapes where a format or pattern applies.  Documents outside
    that style (which the grammar refuses although the schema accepts them)
    are not candidates: the grammar is stricter there on purpose
    (docs/grammar.md).
  "refused": each {name, schema, message}: schemas outside the supported
    subset and the message the compiler must give (written here, not by
    jsonschema; jsonschema only confirms the schema itself is valid).
  "sampled": names of cases tests/test_json_schema_engine.c samples from.

Python is only a fixture-making tool; nothing in the runtime or build needs it.
Needs: pip install jsonschema rfc3339-validator (the FormatChecker's
date-time and time checks come from rfc3339-validator).

Usage: python tests/reference/make_schema_fixtures.py
"""
import importlib.metadata
import json
import os

import rfc3339_validator  # noqa: F401  (date-time and time need it)
from jsonschema import Draft202012Validator

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "json_schema", "cases.json")

STYLES = [
    dict(ensure_ascii=False, separators=(",", ":")),
    dict(ensure_ascii=False, separators=(", ", ": ")),
    dict(ensure_ascii=False, indent=2),
]

OBJ = "object"
person = {"type": OBJ, "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}

CASES = [
    ("string", {"type": "string"}, ["", "abc", "é ü", "a\"b", "\\", 1, None, ["a"]]),
    ("integer", {"type": "integer"}, [0, -7, 12345, 1.5, "1", True, None]),
    ("number", {"type": "number"}, [0, -1.25, 3.5e10, 12, "x", None, False]),
    ("boolean", {"type": "boolean"}, [True, False, 0, "true", None]),
    ("null", {"type": "null"}, [None, 0, "", False]),
    ("type_list", {"type": ["string", "null"]}, ["a", None, 3, True]),
    ("any", {}, [1, "a", None, {"a": [1, 2]}, [True]]),
    ("object_required", person,
     [{"name": "Ann", "age": 31}, {"name": "Bo"}, {"age": 3}, {"name": "C", "age": "3"},
      {"name": "D", "age": 4, "x": 1}, {}, [], "s"]),
    ("object_optional", {"type": OBJ, "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                                      "c": {"type": "boolean"}},
                         "required": ["b"], "additionalProperties": False},
     [{"b": "x"}, {"a": 1, "b": "x"}, {"b": "x", "c": True}, {"a": 1, "b": "y", "c": False}, {"a": 1},
      {"a": 1, "c": True}, {}, {"b": 1}, {"b": "x", "d": 1}]),
    ("object_all_optional", {"type": OBJ, "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                             "additionalProperties": False},
     [{}, {"a": 1}, {"b": 2}, {"a": 1, "b": 2}, {"c": 1}, {"a": "1"}]),
    ("object_additional_true", {"type": OBJ, "properties": {"id": {"type": "integer"}}, "required": ["id"]},
     [{"id": 1}, {"id": 1, "extra": "x"}, {"id": 2, "i": [1], "idx": None}, {"id": "1"}, {"extra": 1},
      {"id": 1, "id2": {"k": 1}}]),
    ("object_additional_schema", {"type": OBJ, "properties": {"kind": {"const": "tag"}},
                                  "additionalProperties": {"type": "number"}},
     [{}, {"kind": "tag"}, {"kind": "tag", "w": 1.5}, {"w": 2, "v": 3}, {"w": "x"}, {"kind": "other"},
      {"kind": "tag", "k": True}, {"ki": 1}]),
    ("object_no_properties", {"type": OBJ, "additionalProperties": False}, [{}, {"a": 1}, []]),
    ("nested", {"type": OBJ, "properties": {
        "user": person, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["user", "tags"], "additionalProperties": False},
     [{"user": {"name": "A", "age": 1}, "tags": []}, {"user": {"name": "A", "age": 1}, "tags": ["x", "y"]},
      {"user": {"name": "A"}, "tags": []}, {"user": {"name": "A", "age": 1}, "tags": [1]},
      {"user": {"name": "A", "age": 1}}]),
    ("enum_strings", {"type": "string", "enum": ["red", "green", "blue"]},
     ["red", "blue", "Red", "yellow", 1, None]),
    ("enum_mixed", {"enum": ["a", 1, None, True, [1, 2], {"k": "v"}]},
     ["a", 1, None, True, [1, 2], {"k": "v"}, "b", 2, False, [2, 1], {"k": "w"}]),
    ("const", {"const": {"x": 1}}, [{"x": 1}, {"x": 2}, {}, 1]),
    ("anyof", {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 10}]},
     ["ab", "abc", 10, 99, "abcd", 9, -10, None]),
    ("oneof_disjoint", {"oneOf": [{"type": OBJ, "properties": {"t": {"const": "a"}, "x": {"type": "integer"}},
                                   "required": ["t", "x"], "additionalProperties": False},
                                  {"type": OBJ, "properties": {"t": {"const": "b"}, "y": {"type": "string"}},
                                   "required": ["t", "y"], "additionalProperties": False}]},
     [{"t": "a", "x": 1}, {"t": "b", "y": "s"}, {"t": "a", "y": "s"}, {"t": "b", "x": 1}, {"t": "c"}]),
    ("allof_objects", {"allOf": [{"type": OBJ, "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                 {"type": OBJ, "properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     [{"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 0}, {"a": 1}, {"b": "x"}, {"a": "1", "b": "x"}]),
    ("ref_defs", {"$defs": {"pt": {"type": OBJ, "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                   "required": ["x", "y"], "additionalProperties": False}},
                  "type": "array", "items": {"$ref": "#/$defs/pt"}, "maxItems": 3},
     [[], [{"x": 1, "y": 2}], [{"x": 1, "y": 2}, {"x": 0.5, "y": -1}], [{"x": 1}],
      [{"x": 1, "y": 2}] * 4, [{"x": 1, "y": "2"}]]),
    ("ref_recursive", {"$defs": {"node": {"type": OBJ, "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
     [{"v": 1}, {"v": 1, "kids": []}, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}, {"v": 1, "kids": [{}]},
      {"kids": []}, {"v": 1, "kids": [{"v": "x"}]}]),
    ("definitions_root_ref", {"definitions": {"s": {"type": "string", "minLength": 1}},
                              "type": OBJ, "properties": {"a": {"$ref": "#/definitions/s"},
                                                          "self": {"$ref": "#"}},
                              "additionalProperties": False},
     [{}, {"a": "x"}, {"self": {"a": "y"}}, {"a": ""}, {"self": {"a": 1}}]),
    ("array_items", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
     [[1, 2], [1, 2, 3, 4], [1], [], [1, 2, 3, 4, 5], [1, "2"]]),
    ("array_min_only", {"type": "array", "minItems": 1}, [[1], [1, "a", None], [], {}]),
    ("prefix_items", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
     [[], ["a"], ["a", 1], ["a", 1, 2], [1], ["a", "b"]]),
    ("prefix_items_tail", {"type": "array", "prefixItems": [{"type": "boolean"}],
                           "items": {"type": "null"}, "minItems": 2},
     [[True, None], [False, None, None], [True], [True, 1], [None, None]]),
    ("string_length", {"type": "string", "minLength": 2, "maxLength": 4},
     ["ab", "abcd", "é€x", "a", "abcde", ""]),
    ("format_date", {"type": "string", "format": "date"},
     ["2024-02-29", "2023-02-28", "2000-02-29", "1999-12-31", "2023-02-29", "1900-02-29", "2023-13-01",
      "2023-04-31", "0000-01-01", "2023-1-01", "x"]),
    ("format_time", {"type": "string", "format": "time"},
     ["12:34:56Z", "23:59:59.123+05:30", "00:00:00-00:00", "12:34:56z", "24:00:00Z", "12:60:00Z",
      "12:34:56", "12:34Z"]),
    ("format_date_time", {"type": "string", "format": "date-time"},
     ["2024-01-02T03:04:05Z", "2024-02-29t23:59:59.5+01:00", "2023-02-29T00:00:00Z", "2024-01-02 03:04:05Z",
      "2024-01-02T03:04:05"]),
    ("format_uuid", {"type": "string", "format": "uuid"},
     ["123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000",
      "123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400", "g23e4567-e89b-12d3-a456-426614174000"]),
    ("format_email", {"type": "string", "format": "email"},
     ["a@b.co", "first.last+x@mail.example.org", "nobody", ""]),
    ("pattern_anchored", {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
     ["AB-123", "ZZ-000", "ab-123", "AB-12", "AB-1234", "xAB-123"]),
    ("pattern_alternation", {"type": "string", "pattern": "^(cat|dog)s?$"},
     ["cat", "dogs", "cats", "cow", "catss", ""]),
    ("pattern_search", {"type": "string", "pattern": "ab+c"},
     ["abc", "xxabbbcyy", "ac", "ab", ""]),
    ("integer_range", {"type": "integer", "minimum": -15, "maximum": 123},
     [-15, -9, 0, 7, 99, 100, 123, -16, 124, 1000, -100]),
    ("integer_exclusive", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
     [1, 9, 0, 10, -1]),
    ("integer_min_only", {"type": "integer", "minimum": 18}, [18, 19, 99, 100, 123456, 17, 9, 0, -18]),
    ("integer_max_only", {"type": "integer", "maximum": -3}, [-3, -4, -100, -2, 0, 5]),
    ("number_range", {"type": "number", "minimum": 0, "maximum": 1},
     [0, 1, 0.5, 0.0001, 1.0, 1.5, -0.5, 2]),
    ("number_exclusive", {"type": "number", "exclusiveMinimum": -2, "exclusiveMaximum": 3},
     [-1.999, -1, 0, 2.75, -2, 3, 3.0001, -2.5]),
    ("object_bounded", {"type": OBJ, "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", None]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "born": {"type": "string", "format": "date"}},
        "required": ["name", "age", "pet"], "additionalProperties": False},
     [{"name": "Al", "age": 7, "pet": None}, {"name": "Al", "age": 7, "pet": "cat", "tags": ["a", "b"]},
      {"name": "Al", "age": 7, "pet": "dog", "born": "2001-02-03"}, {"name": "", "age": 7, "pet": None},
      {"name": "Al", "age": 121, "pet": None}, {"name": "Al", "age": 7, "pet": "cow"},
      {"name": "Al", "age": 7, "pet": None, "tags": ["a", "a", "b", "b"]},
      {"name": "Al", "age": 7, "pet": None, "born": "2001-02-30"}]),
    ("nullable_object_property", {"type": OBJ, "properties": {"note": {"type": ["string", "null"]},
                                                               "n": {"type": "integer", "minimum": 1}},
                                  "required": ["note", "n"], "additionalProperties": False},
     [{"note": None, "n": 1}, {"note": "x", "n": 5}, {"note": "x", "n": 0}, {"n": 1}]),
]

REFUSED = [
    ("pattern_properties", {"type": OBJ, "properties": {"a": {"type": OBJ, "patternProperties": {"^x": {}}}}},
     'unsupported JSON Schema keyword "patternProperties" at /properties/a'),
    ("not", {"not": {"type": "string"}}, 'unsupported JSON Schema keyword "not" at the root'),
    ("if_then", {"type": OBJ, "if": {}, "then": {}}, 'unsupported JSON Schema keyword "if" at the root'),
    ("min_properties", {"type": OBJ, "minProperties": 1}, 'unsupported JSON Schema keyword "minProperties" at the root'),
    ("multiple_of", {"type": "array", "items": {"type": "integer", "multipleOf": 3}},
     'unsupported JSON Schema keyword "multipleOf" at /items'),
    ("contains", {"type": "array", "contains": {"type": "integer"}}, 'unsupported JSON Schema keyword "contains" at the root'),
    ("unique_items", {"type": "array", "uniqueItems": True}, 'unsupported JSON Schema keyword "uniqueItems" at the root'),
    ("ref_in_defs", {"$defs": {"a": {"type": "string", "propertyNames": {}}}, "$ref": "#/$defs/a"},
     'unsupported JSON Schema keyword "propertyNames" at /$defs/a'),
    ("remote_ref", {"$ref": "https://example.com/s.json"}, 'JSON Schema: "$ref" at the root'),
    ("pattern_lookahead", {"type": "string", "pattern": "^(?=a)a$"}, 'JSON Schema: "pattern" at the root'),
    ("pattern_backref", {"type": "string", "pattern": "^(a)\\1$"}, 'JSON Schema: "pattern" at the root'),
    ("format_unknown", {"type": "string", "format": "hostname"}, 'JSON Schema: "format" at the root'),
    ("number_fraction_bound", {"type": "number", "minimum": 0.5}, 'JSON Schema: "minimum" at the root'),
    ("allof_additional", {"allOf": [{"type": OBJ, "additionalProperties": False}]}, 'JSON Schema: "allOf" at /allOf/0'),
    ("required_undeclared", {"type": OBJ, "properties": {}, "required": ["x"]}, 'JSON Schema: "required" at the root'),
    ("dependent_required", {"type": OBJ, "properties": {"a": {"type": "integer"}},
                            "dependentRequired": {"a": ["b"]}},
     'unsupported JSON Schema keyword "dependentRequired" at the root'),
]

SAMPLED = ["object_bounded", "anyof", "array_items", "format_date", "integer_range", "number_range"]


def main():
    cases = []
    for i, (name, schema, candidates) in enumerate(CASES):
        Draft202012Validator.check_schema(schema)
        v = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        valid, invalid = [], []
        for k, doc in enumerate(candidates):
            text = json.dumps(doc, **STYLES[(i + k) % len(STYLES)])
            (valid if v.is_valid(doc) else invalid).append(text)
        assert valid and (invalid or schema == {}), f"{name}: needs valid and invalid documents"
        cases.append({"name": name, "schema": schema, "valid": valid, "invalid": invalid})
    refused = []
    for name, schema, message in REFUSED:
        Draft202012Validator.check_schema(schema)
        refused.append({"name": name, "schema": schema, "message": message})
    assert len(cases) >= 30
    out = {"generator": "tests/reference/make_schema_fixtures.py", "jsonschema": importlib.metadata.version("jsonschema"),
           "draft": "2020-12", "cases": cases, "refused": refused, "sampled": SAMPLED}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases, {sum(len(c['valid']) + len(c['invalid']) for c in cases)} documents, "
          f"{len(refused)} refused")


if __name__ == "__main__":
    main()
