#!/usr/bin/env python3
"""Differential fuzzing of the C chat-template interpreter against transformers.

Writes random cases to a JSON file (not committed) in the format of
tests/fixtures/chat/snippets.json; run the C side with

    python3 tests/reference/fuzz_chat_templates.py SEED COUNT chat-fuzz.json
    MOERUN_CHAT_FUZZ=chat-fuzz.json build/test_chat_template --filter 'chat_fuzz/*'

Two kinds of cases: random conversations (roles, contents with quotes,
newlines, Unicode, <think>, tool calls, reasoning, tools, enable_thinking)
on every committed template, and random expressions over filters, tests,
methods, operators and slicing.  Expected text comes from the same code
path as make_chat_fixtures.py.  Expressions whose Python text shows a
documented difference (an address, a dict view, a tuple) are left out; the C test counts MOE_ERR_UNSUPPORTED
results apart (reported, not failed) and, where Python raised, requires
only that C fails too (Python's generators fail later, when consumed).
"""
import copy
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_chat_fixtures as m  # noqa: E402

PIECES = ["hello", " ", "  ", "\n", "\n\n", "\t", "é", "世界", "🙂", "'", '"', "\\", "<think>", "</think>",
          "<tool_response>", "</tool_response>", "{{ x }}", "{%", "#}", "[INST]", "\u00a0", "\u2028", "0", "True",
          "None", " a ", "\r\n"]


def text():
    return "".join(random.choice(PIECES) for _ in range(random.randint(0, 6)))


def message():
    role = random.choice(["user", "assistant", "system", "tool", "user", "assistant"])
    msg = {"role": role, "content": text()}
    if role == "assistant" and random.random() < 0.3:
        calls = []
        for _ in range(random.randint(1, 2)):
            args = {"a": random.choice([1, 2.5, "x", None, True, [1, "é"], {"k": "v"}])}
            calls.append({"id": random.choice(["abcDEF123", "call_1"]), "type": "function",
                          "function": {"name": random.choice(["add", "get_weather"]),
                                       "arguments": json.dumps(args) if random.random() < 0.3 else args}})
        msg["tool_calls"] = calls
        if random.random() < 0.3:
            msg["content"] = None if random.random() < 0.2 else ""
    if role == "assistant" and random.random() < 0.2:
        msg["reasoning_content"] = text()
    elif role == "assistant" and random.random() < 0.15:
        msg["thinking"] = text()  # gpt-oss's name for it
    if role == "tool" and random.random() < 0.5:
        msg["tool_call_id"] = random.choice(["abcDEF123", "x"])
    return msg


def conversation_cases(count):
    out = []
    for name, special in m.SPECIAL.items():
        with open(os.path.join(m.OUT, name + ".jinja"), encoding="utf-8", newline="") as f:
            tpl = f.read()
        for _ in range(count):
            msgs = [message() for _ in range(random.randint(1, 6))]
            if random.random() < 0.5:  # mostly well-formed alternation
                msgs = ([{"role": "system", "content": text()}] if random.random() < 0.4 else []) + \
                       [{"role": "user" if k % 2 == 0 else "assistant", "content": text()}
                        for k in range(random.randint(1, 5))]
            extra = {}
            if random.random() < 0.3:
                extra["tools"] = random.choice([m.TOOLS, [m.CALC_TOOL], [], [m.SEARCH_TOOL, m.NO_PARAMS_TOOL],
                                                [m.CART_TOOL, m.EMPTY_PARAMS_TOOL]])
            if random.random() < 0.3:
                extra["enable_thinking"] = random.choice([True, False])
            if random.random() < 0.2:
                extra["reasoning_effort"] = random.choice(["low", "medium", "high"])
            if random.random() < 0.15:
                extra["builtin_tools"] = random.sample(["browser", "python", "brave_search"], random.randint(1, 2))
            agp = random.random() < 0.5
            case = {"name": name, "template_file": name + ".jinja", "messages": msgs, "add_generation_prompt": agp,
                    "extra": {**special, **extra}}
            try:
                case["expected"] = m.render(tpl, msgs, agp, extra, special)
            except Exception as e:
                case["error"] = f"{type(e).__name__}: {e}"
            out.append(case)
    return out


VARS = {"s": "Héllo, Wörld ", "t": "a,b,,c", "n": 7, "f": 2.5, "z": 0, "neg": -3, "b": True, "l": [3, 1, "x", None, 2.0],
        "nl": [1, 2, 3], "sl": ["b", "A", "c"], "d": {"k": "v", "n": 1, "l": [1, 2]}, "e": "", "none": None,
        "ms": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " yo "}]}
ATOMS = ["s", "t", "n", "f", "z", "neg", "b", "l", "nl", "sl", "d", "e", "none", "ms", "undef", "'str'", "\"q'uote\"",
         "1", "0", "-1", "2.0", "1e3", "true", "false", "none", "[]", "[1, 'a']", "{}", "{'a': 1}", "''", "'  pad  '"]
BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or", "**"]
FILTERS = ["trim", "length", "upper", "lower", "capitalize", "title", "string", "int", "float", "list", "first", "last",
           "tojson", "join", "join(',')", "default('D')", "default('D', true)", "reverse", "abs", "safe", "e", "items",
           "select", "reject('none')", "map('string')", "sort", "unique", "indent(2)", "replace('l', 'L')", "count",
           "selectattr('role')", "map(attribute='content')", "tojson(indent=1)", "dictsort", "trim('H')"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "sequence", "iterable",
         "true", "false", "odd", "even", "divisibleby(2)", "eq 1", "in [1, 2]", "lower", "upper", "boolean"]
METHODS = ["strip()", "lstrip()", "rstrip()", "split()", "split(',')", "split(',', 1)", "upper()", "lower()", "title()",
           "capitalize()", "startswith('H')", "endswith(' ')", "replace('l', '')", "find('l')", "count('l')",
           "get('k')", "get('x', 1)", "items()", "keys()", "values()"]


def expr(d=0):
    r = random.random()
    if d > 3 or r < 0.3:
        return random.choice(ATOMS)
    if r < 0.5:
        return f"({expr(d + 1)} {random.choice(BINOPS)} {expr(d + 1)})"
    if r < 0.65:
        return f"({expr(d + 1)} | {random.choice(FILTERS)})"
    if r < 0.72:
        return f"({expr(d + 1)} is {random.choice(['', 'not '])}{random.choice(TESTS)})"
    if r < 0.8:
        return f"{random.choice(['s', 't', 'd', 'e', 'sl'])}.{random.choice(METHODS)}"
    if r < 0.83:  # attributes and methods not called at once
        obj = random.choice(['s', 'd', 'sl', 'n', 'f', 'b', 'ms[0]'])
        attr = random.choice(['.items', "['items']", "['k']", '.get', '.upper', '.real', '.imag', '.count',
                              '.append', '.pop', '.nope', "['nope']", "['get']('k')", "['upper']()", "['strip']()"])
        return f"{obj}{attr}"
    if r < 0.87:
        idx = random.choice(['0', '-1', '1:', ':2', '::-1', '5', '1:-1', '::2'])
        return f"{random.choice(['l', 's', 'nl', 'sl', 'e'])}[{idx}]"
    if r < 0.92:
        return f"(not {expr(d + 1)})"
    if r < 0.96:
        return f"({expr(d + 1)} if {expr(d + 1)} else {expr(d + 1)})"
    return f"[{expr(d + 1)}, {expr(d + 1)}]"


UNPRINTABLE = re.compile(r" at 0x[0-9a-f]+>|dict_(items|keys|values)\(|Markup\(|"
                         r"\((?:'|\d|-|None|True|False|\[|\(|\{|\))")


def leaks_address(src):
    """Whether the text shows a generator, iterator or method (with its
    address) or a dict view, possibly one character at a time."""
    out = m.render_snippet(src, copy.deepcopy(VARS))
    squeezed = re.sub(r"[^a-z]", "", out)
    return any(w in squeezed for w in ("generatorobject", "iteratorobject", "builtinmethod", "dictitems",
                                       "dictkeys", "dictvalues"))


def expression_cases(count):
    out = []
    for i in range(count):
        if random.random() < 0.8:
            src = "{{ " + expr() + " }}"
        else:
            src = "{% for x in " + expr() + " %}[{{ loop.index }}:{{ x }}]{% else %}E{% endfor %}"
        case = {"name": f"expr{i}", "template": src, "vars": copy.deepcopy(VARS)}
        try:
            case["expected"] = m.render_snippet(src, copy.deepcopy(VARS))
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        if "expected" in case and (UNPRINTABLE.search(case["expected"]) or leaks_address(src)):
            continue  # documented differences: addresses, dict views, tuples
        out.append(case)
    return out


def main():
    seed, count, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    random.seed(seed)
    doc = {"now": m.NOW, "cases": conversation_cases(count), "snippets": expression_cases(count * 10)}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    print(f"{len(doc['cases'])} conversations, {len(doc['snippets'])} expressions")


if __name__ == "__main__":
    main()
