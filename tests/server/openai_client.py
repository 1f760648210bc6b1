"""The official openai client against moerun serve: completions and chat,
streaming and not.  Prints one JSON object with the texts (the C test
compares them with `moerun run`).  Usage: openai_client.py BASE_URL MODEL"""
import json
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0, timeout=60)
model = sys.argv[2]
out = {}
r = client.completions.create(model=model, prompt="Hello", max_tokens=16, temperature=0)
out["completion"] = r.choices[0].text
assert r.usage.completion_tokens >= 1
s = client.completions.create(model=model, prompt="Hello", max_tokens=16, temperature=0,
                              stream=True, stream_options={"include_usage": True})
text, usage = "", None
for ev in s:
    if ev.choices:
        text += ev.choices[0].text
    if ev.usage:
        usage = ev.usage
out["completion_stream"] = text
assert usage and usage.completion_tokens == r.usage.completion_tokens, usage
msgs = [{"role": "user", "content": "Hi"}]
c = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0)
out["chat"] = c.choices[0].message.content
assert c.choices[0].message.role == "assistant"
s = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0,
                                   stream=True)
out["chat_stream"] = "".join(ev.choices[0].delta.content or "" for ev in s if ev.choices)
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    raise AssertionError("an unknown model was accepted")
except openai.BadRequestError as e:
    out["bad_model_status"] = e.status_code
models = client.models.list()
out["models"] = [m.id for m in models.data]
print(json.dumps(out))
