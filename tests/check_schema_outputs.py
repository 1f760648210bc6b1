#!/usr/bin/python3
"""Checks outputs sampled under JSON Schema grammars with the jsonschema
package (Debian's python3-jsonschema; tools/deps.sh installs it).  Run by
tests/test_json_schema_engine.c, not by hand.

Input (argv[1]): {"schemas": {name: schema}, "outputs": {name: [text, ...]}}.
Each text must parse as JSON and validate against its schema under
Draft 2020-12 with the FormatChecker.  Prints one line per schema and the
first invalid outputs; exits 1 if any output is invalid.
"""
import json
import sys

from jsonschema import Draft202012Validator


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        data = json.load(f)
    bad = 0
    for name, texts in data["outputs"].items():
        v = Draft202012Validator(data["schemas"][name], format_checker=Draft202012Validator.FORMAT_CHECKER)
        n_bad = 0
        for t in texts:
            try:
                err = next(iter(v.iter_errors(json.loads(t))), None)
                why = err.message if err else None
            except ValueError as e:
                why = f"not JSON: {e}"
            if why:
                n_bad += 1
                if n_bad <= 3:
                    print(f"{name}: INVALID {t!r}: {why}")
        print(f"{name}: {len(texts) - n_bad} of {len(texts)} valid")
        bad += n_bad
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
