"""Structured outputs through the official openai client: for each Pydantic
model below, `client.chat.completions.parse(response_format=Model)` (the
client turns the model into a strict JSON Schema: $defs and $ref, anyOf,
enum, const, formats, ranges, lengths) returns a parsed object of that
model, sampled and greedy; `client.chat.completions.stream` with a
response_format streams one too.  The demo model writes stories, so what
it returns is whatever the grammar let through; that it always parses is
the point.  Prints one line per model.  Usage: openai_parse.py BASE_URL MODEL"""
import datetime
import enum
import sys
import uuid
from typing import Annotated, List, Literal, Optional, Union

import openai
from pydantic import BaseModel, Field

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0, timeout=120)
model = sys.argv[2]
Short = Annotated[str, Field(max_length=12)]


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Flag(BaseModel):
    ok: bool


class Count(BaseModel):
    n: Annotated[int, Field(ge=0, le=99)]


class Score(BaseModel):
    score: Annotated[float, Field(ge=-1, le=1)]


class Pet(BaseModel):
    name: Short
    kind: Literal["dog", "cat", "bird"]


class Person(BaseModel):
    name: Short
    age: Annotated[int, Field(ge=0, le=120)]
    pets: Annotated[List[Pet], Field(min_length=1, max_length=2)]


class Paint(BaseModel):
    color: Color
    layers: Annotated[int, Field(ge=1, le=3)]


class Maybe(BaseModel):
    nickname: Optional[Short]
    count: Optional[Annotated[int, Field(ge=0, le=9)]]


class Shape(BaseModel):
    shape: Union[Literal["circle"], Literal["square"]]
    size: Annotated[int, Field(ge=1, le=9)]


class Version(BaseModel):
    kind: Literal["v1"]
    tags: Annotated[List[Short], Field(max_length=2)]


class Event(BaseModel):
    day: datetime.date
    at: datetime.time


class Stamp(BaseModel):
    when: datetime.datetime


class Ident(BaseModel):
    id: uuid.UUID


class Node(BaseModel):
    label: Short
    child: Optional[Pet]


class Team(BaseModel):
    lead: Person
    second: Optional[Person]


class Either(BaseModel):
    value: Union[Flag, Count]


class Words(BaseModel):
    words: Annotated[List[Literal["yes", "no", "maybe"]], Field(min_length=2, max_length=4)]


MODELS = [Flag, Count, Score, Pet, Person, Paint, Maybe, Shape, Version, Event, Stamp, Ident, Node, Team,
          Either, Words]
msgs = [{"role": "user", "content": "Once upon a time, there was a happy dog."}]
for cls in MODELS:
    for temp in (0.0, 1.0):
        c = client.chat.completions.parse(model=model, messages=msgs, response_format=cls, max_tokens=1500,
                                          temperature=temp, seed=11)
        msg = c.choices[0].message
        assert c.choices[0].finish_reason == "stop", (cls.__name__, temp, c.choices[0].finish_reason, msg.content)
        assert isinstance(msg.parsed, cls), (cls.__name__, msg.content)
    print("%s: %s" % (cls.__name__, msg.parsed.model_dump_json()))
with client.chat.completions.stream(model=model, messages=msgs, response_format=Person, max_tokens=1500,
                                    temperature=1.0, seed=3) as st:
    deltas = sum(1 for ev in st if ev.type == "content.delta")
    final = st.get_final_completion()
assert deltas > 1 and isinstance(final.choices[0].message.parsed, Person), final
print("stream Person: %d deltas, %s" % (deltas, final.choices[0].message.parsed.model_dump_json()))
print("OK %d models" % len(MODELS))
