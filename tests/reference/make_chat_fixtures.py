#!/usr/bin/env python3
"""Builds the chat-template conformance fixtures under tests/fixtures/chat/.

Needs transformers (fixtures were made with 5.24) and jinja2 (3.1.6).
Nothing at build or test time runs this script; its outputs are committed.

The templates themselves (<name>.jinja, the model's tokenizer_config.json
"chat_template" verbatim) are committed next to the fixtures; their sources
are listed in tests/fixtures/chat/README.md.  For each template this script
renders a set of conversations with transformers' own code path,
transformers.utils.chat_template_utils.render_jinja_template, which is what
PreTrainedTokenizerBase.apply_chat_template(tokenize=False) calls with
template_kwargs = {**special_tokens_map, **kwargs}; the special tokens and
kwargs are given here as "extra" (the same object moe_chat_template_render
takes).  strftime_now reads datetime.now(), which is pinned to NOW (UTC) so
the Llama-3.2 date logic is reproducible; the C test sets TZ=UTC and the
same clock.

Output <name>.json: {"template": file, "now": epoch seconds, "cases": [
  {"name", "messages", "add_generation_prompt", "extra",
   "expected": text}  or  {..., "error": message}  ]}
"""
import datetime as _dt
import json
import os

import transformers
from transformers.utils import chat_template_utils as ctu

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "chat")
NOW = 1721995200  # 2024-07-26 12:00:00 UTC


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(NOW, _dt.timezone.utc).replace(tzinfo=None)


ctu.datetime = _FixedDatetime  # strftime_now's clock

SPECIAL = {
    "qwen2.5": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "llama3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mixtral": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "olmoe": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|padding|>"},
    "chatml": {"bos_token": "<s>", "eos_token": "<|im_end|>"},
}

U = lambda c: {"role": "user", "content": c}
A = lambda c: {"role": "assistant", "content": c}
S = lambda c: {"role": "system", "content": c}

TRICKY = ("Unicode: héllo wörld — 世界 🙂 Ω\n'single' \"double\" \\backslash\\ {{ not jinja }} {% raw %}\n"
          "\ttab, trailing spaces   \n\nblank line above\u00a0nbsp")

GENERIC = [
    ("single_user", [U("Hello!")]),
    ("system_user", [S("You are a terse assistant."), U("What is 2+2?")]),
    ("multi_turn", [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")]),
    ("system_multi_turn", [S("Be brief."), U("Hi"), A("Hi."), U("Bye"), A("Bye.")]),
    ("unicode_quotes_newlines", [S(TRICKY), U(TRICKY), A(TRICKY), U("  padded  ")]),
    ("empty_content", [U("")]),
    ("empty_assistant", [U("x"), A(""), U("y")]),
    ("ends_with_assistant", [U("Q?"), A("A.")]),
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — with ünïcode",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}
CALC_TOOL = {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                              "parameters": {"type": "object", "properties": {
                                                  "a": {"type": "number"}, "b": {"type": "number"}}}}}
TOOLS = [WEATHER_TOOL, CALC_TOOL]


def tool_call(name, args, as_string=False):
    return {"id": "call_1", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if as_string else args}}


TOOL_CONV = [
    U("What's the weather in Paris?"),
    {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", {"city": "Paris", "unit": "celsius"})]},
    {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
    A("It is 21 °C and clear in Paris."),
    U("Thanks"),
]


def cases_for(name):
    cases = []
    for cname, msgs in GENERIC:
        for agp in (True, False):
            cases.append((f"{cname}{'_gen' if agp else ''}", msgs, agp, {}))
    if name in ("qwen2.5", "qwen3"):
        cases += [
            ("tools_gen", [U("What's the weather in Paris?")], True, {"tools": TOOLS}),
            ("tools_system_gen", [S("Use tools wisely."), U("Add 2 and 3")], True, {"tools": TOOLS}),
            ("tool_round_trip", TOOL_CONV, True, {"tools": TOOLS}),
            ("tool_round_trip_no_tools", TOOL_CONV, False, {}),
            ("two_tool_calls_two_results",
             [U("Weather in Paris and Rome?"),
              {"role": "assistant", "content": "Let me check.",
               "tool_calls": [tool_call("get_weather", {"city": "Paris"}),
                              tool_call("get_weather", {"city": "Rome"}, as_string=True)]},
              {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rainy"}],
             True, {"tools": TOOLS}),
        ]
    if name == "qwen3":
        think = [U("2+2?"), A("<think>\nAdd them.\n</think>\n\n4"), U("3+3?")]
        cases += [
            ("enable_thinking_false_gen", [U("Hi")], True, {"enable_thinking": False}),
            ("enable_thinking_true_gen", [U("Hi")], True, {"enable_thinking": True}),
            ("think_in_history", think, True, {}),
            ("think_last_assistant", [U("2+2?"), A("<think>\nAdd.\n</think>\n\n4")], False, {}),
            ("reasoning_content_field", [U("2+2?"), {"role": "assistant", "content": "4",
                                                      "reasoning_content": "Simple sum."}], False, {}),
            ("reasoning_alias_field", [U("2+2?"), {"role": "assistant", "content": "4",
                                                    "reasoning": "Aliased."}], False, {}),
            ("tool_response_as_user", [U("<tool_response>\nx\n</tool_response>"), A("ok"), U("real")], True, {}),
        ]
    if name.startswith("llama3"):
        cases += [
            ("tools_gen", [S("Be helpful."), U("What's the weather in Paris?")], True, {"tools": TOOLS}),
            ("tools_in_system", [U("Add 2 and 3")], True, {"tools": TOOLS, "tools_in_user_message": False}),
            ("tool_round_trip", [U("Weather?"),
                                 {"role": "assistant", "tool_calls": [tool_call("get_weather", {"city": "Paris"})]},
                                 {"role": "tool", "content": {"temperature": 21}},
                                 {"role": "tool", "content": "plain text result"},
                                 A("21 degrees.")], True, {"tools": TOOLS}),
            ("date_string", [U("Date?")], True, {"date_string": "01 Jan 2025"}),
            ("raise_two_tool_calls", [U("x"), {"role": "assistant", "tool_calls": [
                tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 3, "b": 4})]}], False, {}),
            ("raise_tools_without_user", [S("sys")], True, {"tools": TOOLS}),
        ]
    if name == "llama3.1":
        cases += [
            ("builtin_tools", [U("Search for moerun")], True,
             {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}),
            ("builtin_tool_call", [U("Search"), {"role": "assistant", "tool_calls": [
                tool_call("brave_search", {"query": "moe inference"})]}, {"role": "ipython", "content": "results"}],
             True, {"builtin_tools": ["brave_search"]}),
        ]
    if name == "mixtral":
        cases += [
            ("raise_two_users", [U("a"), U("b")], True, {}),
            ("raise_starts_with_assistant", [A("a"), U("b")], True, {}),
            ("raise_tool_role", [U("a"), A("b"), {"role": "tool", "content": "c"}, A("d")], False, {}),
            ("raise_system_not_first", [U("a"), S("b")], True, {}),
        ]
    return cases


def render(template, msgs, agp, extra, special):
    kwargs = {**special, **{k: v for k, v in extra.items() if k not in ("tools", "documents")}}
    out, _ = ctu.render_jinja_template(conversations=[msgs], tools=extra.get("tools"),
                                       documents=extra.get("documents"), chat_template=template,
                                       add_generation_prompt=agp, **kwargs)
    return out[0]


def main():
    summary = []
    for name, special in SPECIAL.items():
        path = os.path.join(OUT, name + ".jinja")
        with open(path, encoding="utf-8", newline="") as f:
            template = f.read()
        cases = []
        for cname, msgs, agp, extra in cases_for(name):
            case = {"name": cname, "messages": msgs, "add_generation_prompt": agp,
                    "extra": {**special, **extra}}
            try:
                case["expected"] = render(template, msgs, agp, extra, special)
            except Exception as e:  # the template's raise_exception, or a Jinja error
                case["error"] = str(e)
            cases.append(case)
        doc = {"template": name + ".jinja", "transformers": transformers.__version__, "now": NOW, "cases": cases}
        with open(os.path.join(OUT, name + ".json"), "w", encoding="utf-8", newline="\n") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        errs = sum("error" in c for c in cases)
        summary.append(f"{name}: {len(cases)} cases ({errs} raise)")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
