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
    "mistral-v1": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "mistral-v3": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "olmoe": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|padding|>"},
    "chatml": {"bos_token": "<s>", "eos_token": "<|im_end|>"},
    "gpt-oss": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
    "deepseek-r1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "deepseek-v3.1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "glm-4.6": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    "kimi-k2": {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]"},
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


# A schema for gpt-oss's TypeScript-like tool namespace: every branch of its
# render_typescript_type macro (arrays of scalars, of objects, of arrays and
# without items; nested objects; enums; oneOf with and without object
# variants; type lists; nullable; defaults of several JSON types).
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the document store",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Free-text query"},
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Only these tags"},
                "scores": {"type": "array", "items": {"type": "number"}},
                "ids": {"type": "array", "items": {"type": "integer"}, "nullable": True},
                "flags": {"type": "array", "items": {"type": "boolean"}},
                "anything": {"type": "array"},
                "maybe_list": {"type": "array", "nullable": True},
                "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                "filters": {"type": "array", "items": {"type": "object", "properties": {
                    "field": {"type": "string"}, "op": {"type": "string", "enum": ["eq", "ne"]}},
                    "required": ["field"]}},
                "big_items": {"type": "array", "items": {"type": "object", "properties": {
                    "a_long_property_name": {"type": "string"}, "another_long_name": {"type": "integer"}}}},
                "loose_items": {"type": "array", "items": {"type": "object"}},
                "sort": {"type": "string", "enum": ["relevance", "date"], "default": "relevance",
                         "description": "Sort order"},
                "limit": {"type": "integer", "default": 10},
                "exact": {"type": "boolean", "default": False},
                "weights": {"type": "object", "default": {"title": 2.0, "body": 1}},
                "lang": {"type": "string", "nullable": True, "default": None},
                "range": {"type": "object", "description": "Date range", "properties": {
                    "from": {"type": "string"}, "to": {"type": "string"},
                    "inner": {"type": "object", "properties": {"deep": {"type": "boolean"}}, "required": ["deep"]}},
                    "required": ["from"]},
                "meta": {"type": "object"},
                "id_or_name": {"oneOf": [{"type": "integer", "description": "numeric id"},
                                         {"type": "string", "default": "x"}], "default": "by name"},
                "target": {"oneOf": [{"type": "object"}, {"type": "string"}]},
                "single_one_of": {"oneOf": [{"type": "object", "properties": {"k": {"type": "string"}}}]},
                "union": {"type": ["string", "null"]},
                "one_type": {"type": ["number"]},
                "untyped": {"description": "No type at all"},
            },
            "required": ["query", "range", "id_or_name"],
        },
    },
}
NO_PARAMS_TOOL = {"type": "function", "function": {"name": "get_time", "description": "Current time"}}
EMPTY_PARAMS_TOOL = {"type": "function", "function": {"name": "ping", "description": "Ping the server",
                                                      "parameters": {"type": "object", "properties": {}}}}
# Parameters named like dict methods: properties.items() must still be the
# method (the sandbox's getattr prefers the attribute to the key).
CART_TOOL = {"type": "function", "function": {"name": "add_to_cart", "description": "Add items", "parameters": {
    "type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}},
                                     "keys": {"type": "object", "properties": {"get": {"type": "string"}}}},
    "required": ["items"]}}}
# An integer enum with a default: the template concatenates the default to a
# str, which Python refuses.
INT_ENUM_TOOL = {"type": "function", "function": {"name": "pick", "description": "Pick a level", "parameters": {
    "type": "object", "properties": {"level": {"type": "integer", "enum": [1, 2, 3], "default": 2}}}}}


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
    if name == "mistral-v3":
        call = {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        cases += [
            ("tools_gen", [S("Be brief."), U("Hi"), A("Hello."), U("Weather in Paris?")], True, {"tools": TOOLS}),
            ("tool_round_trip", [U("Weather in Paris?"), {"role": "assistant", "content": "", "tool_calls": [call, call]},
                                 {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"t\": 21}"},
                                 {"role": "tool", "tool_call_id": "abcDEF123", "content": {"content": "nested"}},
                                 A("  21 degrees.  "), U("Thanks")], True, {"tools": TOOLS}),
            ("raise_bad_call_id", [U("x"), {"role": "assistant", "tool_calls": [tool_call("add", {"a": 1})]}], False, {}),
            ("raise_bad_result_id", [U("x"), {"role": "assistant", "tool_calls": [call]},
                                     {"role": "tool", "tool_call_id": "short", "content": "r"}], False, {}),
            ("raise_two_users", [U("a"), U("b")], True, {}),
            ("raise_unknown_role", [U("a"), {"role": "critic", "content": "b"}], True, {}),
        ]
    if name in ("mixtral", "mistral-v1"):
        cases += [
            ("raise_two_users", [U("a"), U("b")], True, {}),
            ("raise_starts_with_assistant", [A("a"), U("b")], True, {}),
            ("raise_tool_role", [U("a"), A("b"), {"role": "tool", "content": "c"}, A("d")], False, {}),
            ("raise_system_not_first", [U("a"), S("b")], True, {}),
        ]
    if name.startswith("deepseek"):
        # DeepSeek's templates concatenate the arguments as a string (an
        # object is Python's TypeError)
        calls = [tool_call("get_weather", {"city": "Paris", "unit": "celsius"}, as_string=True),
                 tool_call("add", {"a": 1, "b": 2.5}, as_string=True)]
        cases += [
            ("tools_gen", [U("What's the weather in Paris?")], True, {"tools": TOOLS}),
            ("tool_call_null_content", [U("Weather?"), {"role": "assistant", "content": None, "tool_calls": calls[:1]}],
             False, {}),
            ("tool_round_trip", [S("Use tools."), U("Weather in Paris, and 1 + 2.5?"),
                                 {"role": "assistant", "content": "Checking.", "tool_calls": calls},
                                 {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "3.5"},
                                 A("Sunny; 3.5."), U("Thanks")], True, {"tools": TOOLS}),
            ("think_in_history", [U("2+2?"), A("<think>\nAdd.\n</think>\n\n4"), U("3+3?")], True, {}),
            ("raise_object_arguments", [U("x"), {"role": "assistant", "content": None,
                                                 "tool_calls": [tool_call("add", {"a": 1})]}], False, {}),
        ]
    if name == "deepseek-v3.1":
        cases += [
            ("thinking_gen", [U("Hi")], True, {"thinking": True}),
            ("enable_thinking_gen", [U("Hi")], True, {"enable_thinking": True}),
            ("prefix_thinking", [U("Hi"), {"role": "assistant", "content": "Well", "prefix": True}], False,
             {"thinking": True}),
        ]
    if name == "glm-4.6":
        cases += [
            ("tools_gen", [S("Use tools wisely."), U("What's the weather in Paris?")], True, {"tools": TOOLS}),
            ("tool_round_trip", TOOL_CONV, True, {"tools": TOOLS}),
            ("two_tool_calls_two_results",
             [U("Weather in Paris, and 1 + 2.5?"),
              {"role": "assistant", "content": "Let me check.",
               "tool_calls": [tool_call("get_weather", {"city": "Paris", "days": 2, "unit": None}),
                              {"name": "add", "arguments": {"a": 1, "b": 2.5, "note": "x \"y\"", "list": [1, "é"]}}]},
              {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "3.5"}], True, {"tools": TOOLS}),
            ("tool_results_as_list", [U("Weather?"), {"role": "assistant", "content": "",
                                                      "tool_calls": [tool_call("get_weather", {"city": "Rome"})]},
                                      {"role": "tool", "content": [{"output": "rainy"}, "plain"]}], True, {}),
            ("enable_thinking_false_gen", [U("Hi")], True, {"enable_thinking": False}),
            ("reasoning_content_field", [U("2+2?"), {"role": "assistant", "content": "4",
                                                      "reasoning_content": "Simple sum."}], False, {}),
            ("think_in_content", [U("2+2?"), A("<think>\nAdd.\n</think>\n\n4")], False, {}),
            ("list_content", [{"role": "user", "content": [{"type": "text", "text": "hi"}, "there"]}], True, {}),
        ]
    if name == "kimi-k2":
        call = {"id": "functions.get_weather:0", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
        call2 = {"id": "functions.add:1", "type": "function",
                 "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2.5}"}}
        cases += [
            ("tools_gen", [U("What's the weather in Paris?")], True, {"tools": TOOLS}),
            ("tool_round_trip", [U("Weather in Paris, and 1 + 2.5?"),
                                 {"role": "assistant", "content": "Checking.", "tool_calls": [call, call2]},
                                 {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
                                 {"role": "tool", "tool_call_id": "functions.add:1", "content": "3.5"},
                                 A("Sunny; 3.5."), U("Thanks")], True, {"tools": TOOLS}),
            ("tool_call_pending", [U("Weather?"), {"role": "assistant", "content": "", "tool_calls": [call],
                                                   "reasoning_content": "Need the tool."},
                                   {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"}],
             True, {"tools": TOOLS}),
            ("named_message", [{"role": "user", "name": "alice", "content": "Hi"}], True, {}),
        ]
    if name == "gpt-oss":
        think = {"role": "assistant", "content": "4", "thinking": "Two plus two."}
        call = lambda **kw: {"role": "assistant", **kw,
                             "tool_calls": [tool_call("get_weather", {"city": "Paris", "unit": "celsius"})]}
        result = {"role": "tool", "content": "{\"temperature\": 21}"}
        cases += [
            ("developer_user", [{"role": "developer", "content": "Answer in French."}, U("Hi")], True, {}),
            ("system_in_the_middle_dropped", [U("a"), S("ignored"), A("b"), {"role": "developer", "content": "x"},
                                              U("c")], True, {}),
            ("reasoning_effort_low", [U("Hi")], True, {"reasoning_effort": "low"}),
            ("reasoning_effort_high", [S("Be brief."), U("Hi")], True, {"reasoning_effort": "high"}),
            ("reasoning_effort_medium", [U("Hi")], False, {"reasoning_effort": "medium"}),
            ("model_identity", [U("Who are you?")], True, {"model_identity": "You are Moe, a helpful assistant."}),
            ("thinking_in_history_dropped", [U("2+2?"), think, U("3+3?")], True, {}),
            ("thinking_last_assistant", [U("2+2?"), think], False, {}),
            ("thinking_last_assistant_gen", [U("2+2?"), think], True, {}),
            ("reasoning_content_aliased", [U("2+2?"), {"role": "assistant", "content": "4",
                                                        "reasoning_content": "Aliased to thinking."}], False, {}),
            ("tools_gen", [U("What's the weather in Paris?")], True, {"tools": TOOLS}),
            ("tools_developer_gen", [S("Use tools wisely."), U("Add 2 and 3")], True, {"tools": TOOLS}),
            ("tools_rich_schema", [U("Find docs")], True, {"tools": [SEARCH_TOOL, NO_PARAMS_TOOL, EMPTY_PARAMS_TOOL]}),
            ("tools_empty_list", [U("Hi")], True, {"tools": []}),
            ("tools_dict_method_names", [U("Buy")], True, {"tools": [CART_TOOL]}),
            ("tool_round_trip", TOOL_CONV, True, {"tools": TOOLS}),
            ("tool_call_pending", [U("Weather?"), call(content=""), result], True, {"tools": TOOLS}),
            ("tool_call_thinking_kept", [U("Weather?"), call(thinking="Need the weather tool."), result], True,
             {"tools": TOOLS}),
            ("tool_call_thinking_dropped", [U("Weather?"), call(thinking="Need the weather tool."), result,
                                            A("21 degrees."), U("Thanks")], True, {"tools": TOOLS}),
            ("tool_call_content_as_analysis", [U("Weather?"), call(content="Let me check."), result], True,
             {"tools": TOOLS}),
            ("tool_call_no_content_key", [U("Weather?"), call(), result], False, {}),
            ("tool_call_string_arguments", [U("Add"), {"role": "assistant", "tool_calls": [
                tool_call("add", {"a": 1, "b": 2}, as_string=True)]}, {"role": "tool", "content": "3"}], True, {}),
            ("tool_call_bare_and_content_type", [U("Run"), {"role": "assistant", "tool_calls": [
                {"name": "run", "arguments": {"code": "print(1)"}, "content_type": "code"}]},
                {"role": "tool", "content": {"stdout": "1\n"}}], True, {}),
            ("two_tool_rounds", [U("Weather in Paris and Rome?"), call(), result,
                                 {"role": "assistant", "tool_calls": [tool_call("get_weather", {"city": "Rome"})]},
                                 {"role": "tool", "content": "rainy"}, {"role": "tool", "content": "still rainy"}],
             True, {"tools": TOOLS}),
            ("builtin_tools_browser", [U("Search")], True, {"builtin_tools": ["browser"]}),
            ("builtin_tools_both_and_functions", [S("sys"), U("Go")], True,
             {"builtin_tools": ["python", "browser", "other"], "tools": [CALC_TOOL], "reasoning_effort": "low"}),
            ("raise_channel_in_content", [U("a"), A("<|channel|>analysis<|message|>x")], True, {}),
            ("raise_channel_in_thinking", [U("a"), {"role": "assistant", "content": "b",
                                                    "thinking": "<|channel|>final<|message|>x"}], True, {}),
            ("raise_content_and_thinking_with_call", [U("a"), call(content="c", thinking="t")], True, {}),
            ("raise_tool_without_call", [U("a"), {"role": "tool", "content": "r"}], True, {}),
            ("raise_tool_after_final", [U("a"), call(), result, A("done"), {"role": "tool", "content": "r"}],
             True, {}),
            ("raise_null_content_with_call", [U("a"), call(content=None)], True, {}),
            ("raise_int_enum_default", [U("a")], True, {"tools": [INT_ENUM_TOOL]}),
            ("raise_list_content", [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], True, {}),
            ("raise_no_messages", [], True, {}),
        ]
    return cases


def render(template, msgs, agp, extra, special):
    kwargs = {**special, **{k: v for k, v in extra.items() if k not in ("tools", "documents")}}
    out, _ = ctu.render_jinja_template(conversations=[msgs], tools=extra.get("tools"),
                                       documents=extra.get("documents"), chat_template=template,
                                       add_generation_prompt=agp, **kwargs)
    return out[0]


# Interpreter snippets: (name, template, variables).  Rendered with the
# environment transformers compiles chat templates in (_compile_jinja_template),
# with the variables render_jinja_template always passes.
SNIPPETS = [
    # whitespace control: trim_blocks, lstrip_blocks, -, +, comments, trailing newline
    ("ws_trim_lstrip", "a\n  {% if true %}\n  b\n  {% endif %}\nc\n", {}),
    ("ws_minus", "a  {{- ' b ' -}}  c {%- if true -%}  d  {%- endif -%}  e", {}),
    ("ws_plus", "a\n  {%+ if true +%}\nb\n{%- endif %}", {}),
    ("ws_comment", "x  {# c #}\n  y\n{#- c -#}  z\n  {# own line #}\nw", {}),
    ("ws_inline_block_not_lstripped", "x {% if true %}y{% endif %} z", {}),
    ("ws_expr_no_trim", "{{ 'a' }}\nb", {}),
    ("ws_two_trailing_newlines", "a\n\n", {}),
    ("ws_crlf_free_text", "line1\n\tline2  \n", {}),
    ("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}!", {}),
    # loops
    ("loop_vars", "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("loop_else", "{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {"xs": []}),
    ("loop_filter", "{% for x in xs if x > 1 %}{{ x }}/{{ loop.length }} {% endfor %}", {"xs": [1, 2, 3]}),
    ("loop_unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": [2]}}),
    ("loop_unpack_filter", "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", {"d": {"x": "y"}}),
    ("loop_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "y": 2}}),
    ("loop_string", "{% for c in 'héllo' %}[{{ c }}]{% endfor %}", {}),
    ("loop_nested", "{% for a in [1,2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("loop_prev_next", "{% for x in [1,2,3] %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }} {% endfor %}", {}),
    ("loop_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_scope", "{% set x = 1 %}{% for i in range(3) %}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}", {}),
    ("loop_scope_iter", "{% for i in range(3) %}{% if i == 0 %}{% set y = 'set' %}{% endif %}[{{ y }}]{% endfor %}", {}),
    ("loop_over_undefined", "{% for x in nothing %}{{ x }}{% else %}none{% endfor %}", {}),
    ("range_forms", "{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ range(5, 0, -2) | list }}", {}),
    # conditionals, set, namespace, macro
    ("if_elif_else", "{% for x in [1,2,3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
    ("set_tuple", "{% set a, b = 1, 'x' %}{{ a }}{{ b }}", {}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("namespace_print", "{% set ns = namespace(a=1) %}{{ ns.a }} {{ ns.missing is defined }}", {}),
    ("block_set", "{% set body %}\n  hello {{ name }}\n{% endset %}[{{ body }}]", {"name": "w"}),
    ("macro", "{% macro greet(who, punct='!') %}Hi {{ who }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(who='c', punct='.') }}", {}),
    ("macro_sees_globals", "{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", {"g": "global"}),
    ("conditional_expr", "{{ 'y' if flag else 'n' }}{{ 'y' if not flag }}|", {"flag": True}),
    # operators
    ("arith", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1.5 + 1 }} {{ -3 }} {{ true + 1 }}", {}),
    ("floats", "{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 1.0 }} {{ 3.14 }} {{ 1e16 }} {{ 123456789012345.6 }} {{ -0.0 }} {{ 2.5e-3 }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true ~ [1] }}|{{ 'a' ~ undefined_var ~ 'b' }}", {}),
    ("plus_str_list", "{{ 'ab' + 'cd' }} {{ [1] + [2, 3] }} {{ 'ab' * 3 }} {{ 2 * '-' }}", {}),
    ("compare", "{{ 1 < 2 }}{{ 2 <= 2 }}{{ 'a' < 'b' }}{{ 1 == 1.0 }}{{ 'a' != 'a' }}{{ [1, 2] == [1, 2] }}{{ {'a': 1} == {'a': 1} }}{{ none == none }}", {}),
    ("in_not_in", "{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 'z' not in 'abc' }}{{ 3 not in [1] }}{{ '' in 'x' }}", {}),
    ("and_or_not", "{{ 1 and 'x' }}|{{ 0 and 'x' }}|{{ 0 or '' or 'z' }}|{{ not 0 }}|{{ not 'a' }}|{{ none or [] }}", {}),
    ("precedence", "{{ 'a' + 'b' | upper }} {{ xs | length - 1 }} {{ not 1 == 2 }} {{ -2 ** 2 }} {{ (1 + 2) ~ 3 }}", {"xs": [1, 2, 3]}),
    # tests
    ("tests", "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ l is sequence }}{{ s is sequence }}{{ d is iterable }}{{ 3 is number }}{{ 3 is integer }}{{ 3.0 is float }}{{ true is boolean }}{{ true is true }}{{ false is false }}{{ 0 is false }}", {"x": 1, "n": None, "s": "s", "d": {}, "l": []}),
    ("tests_args", "{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 'a' is equalto 'a' }}{{ 2 is in [1, 2] }}{{ 'A' is upper }}{{ 'a' is lower }}{{ 3 is gt 2 }}{{ x is not none }}", {"x": 1}),
    # filters
    ("filter_trim", "[{{ '  a b \n' | trim }}][{{ 'xxaxx' | trim('x') }}][{{ '\u3000wide\u00a0' | trim }}]", {}),
    ("filter_length", "{{ 'héllo' | length }} {{ [1, 2] | length }} {{ {'a': 1} | length }} {{ missing | length }} {{ 'abc' | count }}", {}),
    ("filter_case", "{{ 'hÉllo wOrld' | upper }} {{ 'HÉLLO' | lower }} {{ 'hello WORLD' | capitalize }} {{ 'hello big-world (x)' | title }}", {}),
    ("filter_replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | replace('', '-') }}", {}),
    ("filter_join", "{{ [1, 'a', none] | join }} {{ ['x', 'y'] | join(', ') }} {{ users | join('/', attribute='name') }}", {"users": [{"name": "a"}, {"name": "b"}]}),
    ("filter_first_last", "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} {{ [] | first }}|", {}),
    ("filter_default", "{{ missing | default('dflt') }} {{ '' | default('e') }} {{ '' | default('e', true) }} {{ none | default('n') }} {{ missing | d('d') }}", {}),
    ("filter_string_int", "{{ 3 | string }}{{ none | string }}{{ '42' | int + 1 }} {{ '4.7' | float }} {{ 'x' | int }} {{ 4.9 | int }} {{ true | int }}", {}),
    ("filter_list_items", "{{ 'ab' | list }} {{ ({'a': 1} | items | list)[0][1] }} {{ {'a': 1, 'b': 2} | list }}", {}),
    ("filter_selectattr", "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }} {{ ms | rejectattr('role', 'eq', 'user') | list | length }} {{ ms | selectattr('tool') | list | length }}", {"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool": 1}, {"role": "user", "content": "c"}]}),
    ("filter_select_reject", "{{ [0, 1, 2, none, ''] | select | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ ['a', 'B'] | map('upper') | list }}", {}),
    ("filter_tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}|{{ s | tojson }}|{{ none | tojson }}{{ true | tojson }}{{ 1.0 | tojson }}|{{ d | tojson(sort_keys=true) }}|{{ d | tojson(separators=(',', ':')) }}|{{ d | tojson(indent=1, separators=(',', ': ')) }}", {"d": {"z": [1, 2.5, None, True], "a": {"k": "\u00fc"}, "e": []}, "s": "\u00e9\n\t\u0001\"\\/\u2028\x7f"}),
    ("filter_reverse_abs", "{{ [1, 2] | reverse | list }} {{ 'abc' | reverse }} {{ -3 | abs }} {{ -2.5 | abs }}", {}),
    ("filter_safe", "{{ '<b>' | safe }} {{ '<&>' }}", {}),
    # indexing, slicing, attributes
    ("index_slice", "{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:2] }}{{ xs[::-1] }}{{ xs[::2] }}{{ xs[-2:] }}{{ xs[5:] }}{{ xs[1:-1] }}{{ xs[3:0:-1] }}", {"xs": [0, 1, 2, 3, 4]}),
    ("string_index_slice", "{{ s[0] }}{{ s[-1] }}{{ s[1:3] }}{{ s[::-1] }}", {"s": "h€llo🙂"}),
    ("missing_items", "[{{ xs[9] }}][{{ d.nokey }}][{{ d['nokey'] }}][{{ d.nokey is defined }}][{{ none.attr }}]", {"xs": [1], "d": {}}),
    ("attr_vs_item", "{{ d.a }}{{ d['a'] }}{{ d.get('a') }}{{ d.get('x', 'dflt') }}{{ d.get('x') }}{{ m.content }}", {"d": {"a": 1}, "m": {"role": "user", "content": "c"}}),
    # methods
    ("str_methods", "[{{ ' a '.strip() }}][{{ 'xax'.strip('x') }}][{{ '\n\na\n'.lstrip('\n') }}][{{ 'a  '.rstrip() }}][{{ 'a,b,,c'.split(',') }}][{{ ' a  b '.split() }}][{{ 'a b c'.split(' ', 1) }}]", {}),
    ("str_methods2", "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'aXa'.replace('a', 'b') }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}{{ '-'.join(['a', 'b']) }}{{ 'abcb'.find('b') }}{{ 'abcb'.count('b') }}", {}),
    ("think_split", "{{ c.split('</think>')[-1].lstrip('\n') }}|{{ c.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') }}", {"c": "<think>\nreason\n</think>\n\nanswer"}),
    ("dict_methods", "{{ (d.items() | list)[1][0] }}{{ d.keys() | list }}{{ d.values() | list }}{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("dict_global", "{{ dict(a=1, b='x') }} {{ dict(a=1).a }}", {}),
    # printing values
    ("print_values", "{{ none }}|{{ true }}|{{ false }}|{{ [1, 'a', none, true, 1.5] }}|{{ {'k': 'v', 'n': none} }}|{{ \"it's\" }}|{{ ['it\\'s', 'q\"'] }}|{{ undefined_thing }}|", {}),
    ("string_escapes", "{{ 'a\\tb\\n' }}|{{ \"\\u00e9\\x41\\\\\" }}|{{ 'a' 'b' }}", {}),
    ("generators", "{% if [] | select %}truthy{% endif %} {{ [1, 2] | map('string') | join('-') }} {{ [0, 1] | select | list }} {{ none | selectattr('a') | list }} {{ [3, 4] | reject('odd') | first }} {% for x in ['a'] | map('upper') %}{{ x }}{{ loop.length }}{% endfor %} {{ 2 in [1, 2] | select }}", {}),
    ("markup", "{{ \"'\" | safe + x + \"'\" | safe }} {{ x | e }} {{ x | escape | escape }} {{ ('<' | safe) ~ '<' }} {{ x | forceescape }} {{ ('<' | safe) * 2 }} {{ 'a' + '<' | safe }}", {"x": "<a href=\"x\">&'"}),
    ("filter_indent", "[{{ 'a\\nb\\n\\nc' | indent }}][{{ 'a\\nb\\n' | indent(2, true) }}][{{ 'a\\n\\nb' | indent(width='> ', blank=true) }}][{{ '' | indent(first=true) }}][{{ 'x\\r\\ny\\u2028z' | indent(1) }}]", {}),
    ("filter_sort", "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'a', 'C'] | sort }} {{ ['b', 'A', 'a'] | sort(case_sensitive=true) }} {{ [1, 3, 2] | sort(reverse=true) }} {{ ms | sort(attribute='n') | map(attribute='id') | join }} {{ ms | sort(attribute='n', reverse=true) | map(attribute='id') | join }}", {"ms": [{"id": "a", "n": 2}, {"id": "b", "n": 1}, {"id": "c", "n": 2}]}),
    ("filter_dictsort_unique", "{% for k, v in {'b': 1, 'A': 3, 'a': 2} | dictsort %}{{ k }}{{ v }}{% endfor %} {% for k, v in {'x': 2, 'y': 1} | dictsort(by='value', reverse=true) %}{{ k }}{% endfor %} {{ ['a', 'A', 'b', 'a'] | unique | list }} {{ ['a', 'A'] | unique(case_sensitive=true) | list }} {{ ms | unique(attribute='n') | map(attribute='id') | join }}", {"ms": [{"id": "a", "n": 2}, {"id": "b", "n": 1}, {"id": "c", "n": 2}]}),
    ("list_repeat_and_case_tests", "{{ [1, 2] * 2 }} {{ 2 * ['a'] }} {{ [1] * 0 }} {{ true * [0] }} {{ '123' is lower }} {{ 'abc1' is lower }} {{ 'ABC' is upper }} {{ 'Ab' is upper }} {{ 5 is lower }}", {}),
    ("err_indent_list", "{{ [1] | indent }}", {}),
    ("err_int_undefined", "{{ nothing | int }}", {}),
    ("attribute_paths", "{{ ts | map(attribute='function.name') | join(',') }} {{ ts | selectattr('function.params.0', 'equalto', 'x') | map(attribute='function.name') | list }} {{ ts | sort(attribute='function.name', reverse=true) | map(attribute='function.name') | join }} {{ ts | join('|', attribute='function.name') }}", {"ts": [{"function": {"name": "b", "params": ["x"]}}, {"function": {"name": "a", "params": ["y"]}}]}),
    ("list_count_reverse", "{{ [1, 2, 1, 1.0].count(1) }} {{ [1, 2] | reverse | list }} {% if [] | reverse %}iterator is truthy{% endif %}", {}),
    ("err_attribute_path_undefined", "{{ ts | map(attribute='nope.name') | list }}", {"ts": [{"a": 1}]}),
    ("err_unhashable_in", "{{ [1] in {} }}", {}),
    ("undefined_in_containers", "{% set l = [u1, 1] %}{{ l }}|{{ l | length }}|{% for x in l %}[{{ x }}]{% endfor %}|{{ l[0] is defined }}|{{ l | join(',') }}|{% set ns = namespace(a=u2) %}{{ ns.a is defined }}|{% set ns.b = u3 %}{{ ns.b is defined }}|{{ {'k': u3}.k is defined }}|{{ [u1] == [u2] }}|{{ ms | map(attribute='nope') | list }}|{{ (ms | map(attribute='nope') | first) is defined }}|{{ ms | map(attribute='nope') | join('-') }}|{{ dict(a=u1) }}", {"ms": [{"a": 1}, {"a": 2}]}),
    ("err_undefined_tojson", "{{ [u1] | tojson }}", {}),
    ("err_sort_mixed", "{{ [1, 'a'] | sort }}", {}),
    ("err_generator_length", "{{ [1] | select | length }}", {}),
    ("err_generator_tojson", "{{ [1] | map('string') | tojson }}", {}),
    ("err_generator_last", "{{ [1] | select | last }}", {}),
    # errors (the C test checks only that rendering fails; messages differ)
    ("err_concat_precedence", "{{ 1 + 2 ~ 3 }}", {}),
    ("err_undefined_attr", "{{ nothing.attr }}", {}),
    ("err_undefined_arith", "{{ nothing + 1 }}", {}),
    ("err_str_plus_int", "{{ 'a' + 1 }}", {}),
    ("err_raise", "{{ raise_exception('custom failure') }}", {}),
    ("err_list_append", "{% set xs = [] %}{{ xs.append(1) }}", {}),
    ("err_none_iter", "{% for x in n %}{% endfor %}", {"n": None}),
    ("err_div_zero", "{{ 1 / 0 }}", {}),
    ("err_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("err_ns_underscore", "{% set ns = namespace(_x=1) %}", {}),
    ("err_lt_types", "{{ 1 < 'a' }}", {}),
    ("strftime", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M') }}", {}),
    # bound methods: the sandbox's getattr finds a Python attribute first,
    # its getitem finds a missing dict key's attribute next (gpt-oss reads
    # param_spec['items'] of schemas that have no "items")
    ("bound_methods", "{% if d['items'] %}T{% endif %} {{ d['items'] is defined }} {{ d['items'] is callable }} {{ d['items']['type'] is defined }} {{ d['items']['type'] == 'string' }} {{ d['keys']() | list }} {{ e.items is callable }} {{ e['items'] }} {{ e.get('get') }} {{ 'ab'['upper']() }} {{ xs['count'](1) }} {{ 'ab'.zfill is defined }} {{ xs.index is defined }} {{ xs.append is defined }}|{{ xs.append }}| {{ d.pop is defined }} {{ d.copy is defined }} {{ d._x is defined }} {{ {'_x': 3}._x }}", {"d": {"a": 1}, "e": {"items": [1], "get": 2}, "xs": [1, 2]}),
    ("bound_method_values", "{% set f = d.values %}{{ f() | list }} {{ f is sameas f }} {{ d.items is sameas d.items }} {{ d.items == d.items }} {{ d.items == e.items }} {{ d.items != d.keys }} {{ d.items in [d.items] }} {% set ns = namespace(g=d.keys) %}{{ ns.g is callable }} {{ ns.g() | list }} {{ [d.values][0]() | list }} {{ (d.items,) | length }} {% for x in [1] %}{% set c = loop.cycle %}{{ c('p', 'q') }}{{ loop.cycle is callable }}{% endfor %} {{ d.x is callable }} {{ d.items.x }}|{{ [d, e] | selectattr('items') | list | length }}", {"d": {"a": 1}, "e": {"items": [1]}}),
    ("number_attributes", "{{ (3).real }} {{ (3).imag }} {{ (2.5).real }} {{ (2.5).imag }} {{ true.numerator }} {{ (7).denominator }} {{ (2.5).numerator is defined }} {{ (3).bit_length is callable }} {{ xs | map(attribute='real') | list }}", {"xs": [1, 2.5]}),
    ("err_method_length", "{{ d['items'] | length }}", {"d": {}}),
    ("err_method_iterate", "{% for x in d.items %}{% endfor %}", {"d": {}}),
    ("err_method_in", "{{ 1 in d.items }}", {"d": {}}),
    ("err_method_tojson", "{{ [d.items] | tojson }}", {"d": {}}),
    ("err_method_compare", "{{ d.items < d.items }}", {"d": {}}),
    ("err_method_element", "{{ d.items[0].x }}", {"d": {}}),
    ("err_method_call_unknown_attribute", "{{ 'abc'.items() }}", {}),
    ("err_call_a_value", "{{ d.a() }}", {"d": {"a": 1}}),
    ("err_unsafe_method", "{{ xs['append'](1) }}", {"xs": []}),
    # Jinja's undefined messages name the object's type and the key's repr
    ("err_list_no_element", "{{ xs[5].role }}", {"xs": [1]}),
    ("err_dict_no_element", "{{ d[0].x }}", {"d": {}}),
    ("err_dict_no_element_none", "{{ d[none].x }}", {"d": {}}),
    ("err_str_no_element", "{{ 'a'[-5].x }}", {}),
    ("err_attribute_repr", "{{ d['it\\'s'].x }}", {"d": {}}),
    ("err_namespace_attribute", "{% set ns = namespace(a=1) %}{{ ns.b() }}", {}),
    ("err_namespace_element", "{% set ns = namespace(a=1) %}{{ ns[0].x }}", {}),
    ("err_loop_attribute", "{% for x in [1] %}{{ loop.nope.x }}{% endfor %}", {}),
    ("err_markup_attribute", "{{ ('a' | safe).x.y }}", {}),
    ("err_dict_global_attribute", "{{ dict.x.y }}", {}),
    # transformers' TemplateNamespace has attributes only: no len, iteration,
    # `in` or JSON, and == is identity
    ("namespace_not_a_container", "{% set ns = namespace(a=1) %}{% set same = ns %}{{ ns is iterable }} {{ ns is mapping }} {{ ns is sequence }} {{ ns == namespace(a=1) }} {{ ns == same }} {{ ns }} {{ ns['a'] }}", {}),
    ("err_namespace_length", "{% set ns = namespace(a=1) %}{{ ns | length }}", {}),
    ("err_namespace_iterate", "{% set ns = namespace(a=1) %}{% for k in ns %}{% endfor %}", {}),
    ("err_namespace_in", "{% set ns = namespace(a=1) %}{{ 'a' in ns }}", {}),
    ("err_namespace_list", "{% set ns = namespace(a=1) %}{{ ns | join }}", {}),
    ("err_namespace_items", "{% set ns = namespace(a=1) %}{{ ns | items | list }}", {}),
    ("err_namespace_tojson", "{% set ns = namespace(a=1) %}{{ ns | tojson }}", {}),
    ("err_zero_negative_power", "{{ (not 1) ** -1 }}", {}),
    ("err_float_pow_overflow", "{{ 10.0 ** 400 }}", {}),
    ("list_dict_literals", "{{ [1, [2, 3], {'a': [4, 5]}] }} {{ {'a': 1, 'b': {'c': []}} }} {{ () | length }} {{ (1,) | length }} {{ (1, 2)[1] }}", {}),
]


def render_snippet(src, variables):
    tpl = ctu._compile_jinja_template(src)
    return tpl.render(messages=[], tools=None, documents=None, add_generation_prompt=False, **variables)


def main():
    summary = []
    snippets = []
    for name, src, variables in SNIPPETS:
        case = {"name": name, "template": src, "vars": variables}
        try:
            case["expected"] = render_snippet(src, variables)
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        snippets.append(case)
    with open(os.path.join(OUT, "snippets.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump({"transformers": transformers.__version__, "now": NOW, "snippets": snippets}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    summary.append(f"snippets: {len(snippets)} ({sum('error' in s for s in snippets)} raise)")
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
