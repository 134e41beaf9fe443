"""Structured outputs and tool calling through the PyPI `openai` client.

Run by scripts/openai_client_test.sh (ctest: structured_output_client), which
starts `kvserve serve --grammar-timeout 1` on the default model and sets
KVSERVE_URL and KVSERVE_API_KEY. Outputs are checked with the PyPI
`jsonschema` package and pydantic; on a 135M model the content is often
silly, but it always has the asked-for shape.
"""
import concurrent.futures
import json
import os
import random
import re
import threading
import time

import jsonschema
import openai
from openai import OpenAI
from pydantic import BaseModel, Field

URL = os.environ["KVSERVE_URL"]
KEY = os.environ["KVSERVE_API_KEY"]
client = OpenAI(base_url=URL, api_key=KEY, max_retries=0, timeout=300)
MODEL = client.models.list().data[0].id

S = {"type": "string", "maxLength": 24}
# Bounded numbers: a small model left free writes digits until max_tokens.
I = {"type": "integer", "minimum": -1000, "maximum": 1000}
N = {"type": "number", "minimum": -1000, "maximum": 1000}
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "age": I}, "required": ["name", "age"]},
    {"type": "object", "properties": {"city": S, "population": {"type": "integer", "minimum": 0}}, "required": ["city"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"x": {"type": "number", "minimum": -5, "maximum": 5}}, "required": ["x"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 20}}, "required": ["n"]},
    {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 4}}, "required": ["n"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"kind": {"const": "point"}, "x": I}, "required": ["kind", "x"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"v": {"type": "array", "items": I, "minItems": 2, "maxItems": 2}}, "required": ["v"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, "required": ["code"]},
    {"type": "object", "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 6}}, "required": ["word"]},
    {"type": "object", "properties": {"email": {"type": "string", "format": "email"}}, "required": ["email"]},
    {"type": "object", "properties": {"day": {"type": "string", "format": "date"}}, "required": ["day"]},
    {"type": "object", "properties": {"ip": {"type": "string", "format": "ipv4"}}, "required": ["ip"]},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}, "required": ["id"]},
    {"type": "object", "properties": {"value": {"anyOf": [I, S]}}, "required": ["value"]},
    {"type": "object", "properties": {"maybe": {"anyOf": [{"type": "null"}, I]}}, "required": ["maybe"]},
    {"type": "object", "properties": {"t": {"type": ["string", "null"], "maxLength": 10}}, "required": ["t"]},
    {"type": "object", "properties": {"owner": {"type": "object", "properties": {"name": S, "age": I},
                                                "required": ["name", "age"]}}, "required": ["owner"]},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": I}, "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    {"type": "object", "properties": {"people": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
        "name": S, "id": I}, "required": ["name", "id"]}}}, "required": ["people"]},
    {"$defs": {"pt": {"type": "object", "properties": {"x": I, "y": I}, "required": ["x", "y"]}},
     "type": "object", "properties": {"start": {"$ref": "#/$defs/pt"}, "end": {"$ref": "#/$defs/pt"}}, "required": ["start", "end"]},
    {"definitions": {"c": {"enum": ["s", "m", "l"]}}, "type": "object", "properties": {"size": {"$ref": "#/definitions/c"}},
     "required": ["size"]},
    {"type": "object", "properties": {"q": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}}, "required": ["q"]},
    {"type": "object", "properties": {"r": {"type": "array", "prefixItems": [I, S], "items": False}},
     "required": ["r"]},
    {"type": "object", "properties": {"meta": {"type": "object", "additionalProperties": I, "maxProperties": 2}},
     "required": ["meta"]},
    {"type": "object", "properties": {"flag": {"type": "boolean"}, "note": S}, "required": ["flag"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"shape": {"oneOf": [
        {"type": "object", "properties": {"r": N}, "required": ["r"]},
        {"type": "object", "properties": {"w": I, "h": I}, "required": ["w", "h"]}]}},
     "required": ["shape"]},
    {"type": "object", "properties": {"grade": {"enum": [1, 2, 3, "pass", None]}}, "required": ["grade"]},
    {"type": "object", "properties": {"title": S, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                                      "genres": {"type": "array", "items": {"enum": ["drama", "comedy"]}, "maxItems": 2}},
     "required": ["title", "year", "genres"]},
]


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def chat(content, max_tokens=200, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=max_tokens, temperature=kwargs.pop("temperature", 0), **kwargs)


def one_schema(i, schema):
    reply = chat("Write one example as JSON.", response_format={
        "type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    choice = reply.choices[0]
    check(choice.finish_reason == "stop", f"schema {i}: finish_reason {choice.finish_reason}: {choice.message.content!r}")
    value = json.loads(choice.message.content)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    return choice.message.content


def check_json_schemas():
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(lambda a: one_schema(*a), enumerate(SCHEMAS)))
    check(len(SCHEMAS) >= 30, "at least 30 schemas")
    print(f"json_schema: {len(outputs)} schemas, every output valid; e.g. {outputs[0]} {outputs[10]} {outputs[22]}")


class Address(BaseModel):
    street: str = Field(max_length=30)
    number: int


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int
    addresses: list[Address] = Field(max_length=2)


def check_pydantic_parse():
    reply = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Describe Anna, 31."}],
                                          response_format=Person, max_tokens=200, temperature=0)
    person = reply.choices[0].message.parsed
    check(isinstance(person, Person), f"parsed {person!r}")
    print(f"pydantic parse: {person!r}")


def check_regex_choice_grammar_json_object():
    reply = client.completions.create(model=MODEL, prompt="The date today is", max_tokens=30, temperature=0,
                                      extra_body={"guided_regex": " [0-9]{4}-[0-9]{2}-[0-9]{2}"})
    check(re.fullmatch(r" [0-9]{4}-[0-9]{2}-[0-9]{2}", reply.choices[0].text), reply.choices[0].text)
    reply = chat("Is the sky blue?", extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}}, temperature=1, seed=3, n=3)
    for c in reply.choices:
        check(c.message.content in ("yes", "no", "maybe"), c.message.content)
    grammar = 'root ::= expr\nexpr ::= term (("+" | "-" | "*") term)*\nterm ::= num | "(" expr ")"\nnum ::= [1-9] [0-9]?'
    reply = chat("Write an arithmetic expression.", max_tokens=40, extra_body={"guided_grammar": grammar})
    text = reply.choices[0].message.content
    check(re.fullmatch(r"[-+*()0-9]+", text), text)
    if reply.choices[0].finish_reason == "stop":
        check(text.count("(") == text.count(")"), text)
        eval(text)  # a well-formed expression (digits, operators, parentheses only: checked above)
    # A short answer is asked for: greedy output differs between CPUs (kernel summation order), and a 135M model can
    # loop inside a JSON string until max_tokens, which leaves a valid but unfinished prefix.
    reply = chat("Give me a JSON object with a cat's name and age.", response_format={"type": "json_object"})
    text = reply.choices[0].message.content
    if reply.choices[0].finish_reason == "stop":
        check(isinstance(json.loads(text), dict), text)
    else:
        check(text.lstrip().startswith("{"), text)
    # Sampling with logprobs reports the constrained distribution.
    reply = chat("Pick a colour.", temperature=1, seed=5, logprobs=True, top_logprobs=3,
                 extra_body={"guided_choice": ["red", "green"]})
    for token in reply.choices[0].logprobs.content:
        check(sum(2.718281828 ** t.logprob for t in token.top_logprobs) <= 1.0001, token)
    print(f"regex / choice / grammar / json_object: ok (expression {text!r})")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}}, "required": ["timezone"]}}}


def check_tools_required():
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    kwargs = dict(model=MODEL, messages=messages, tools=[WEATHER, TIME], tool_choice="required", max_tokens=120,
                  temperature=0.7, seed=11)
    whole = client.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    check(choice.finish_reason == "tool_calls", choice.finish_reason)
    calls = choice.message.tool_calls
    check(calls and len(calls) >= 1, f"calls {calls}")
    for call in calls:
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    # Streaming, same seed: the chunks reassemble into the same calls.
    streamed, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            entry = streamed.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    check(finish == "tool_calls", finish)
    check([streamed[i] for i in sorted(streamed)] == [{"name": c.function.name, "arguments": c.function.arguments} for c in calls],
          f"streamed {streamed} vs {calls}")
    # A named function.
    named = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME], max_tokens=120, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    check(all(c.function.name == "get_time" for c in named.choices[0].message.tool_calls), named.choices[0].message)
    # The call and its result go back to the model, which answers in text.
    follow = client.chat.completions.create(model=MODEL, max_tokens=40, temperature=0, tools=[WEATHER], messages=messages + [
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls[:1]]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temperature": 18, "sky": "clear"})}],
        tool_choice="none")
    check(follow.choices[0].message.content, follow.choices[0].message)
    print(f"tools: {calls[0].function.name}({calls[0].function.arguments}); streamed equal; follow-up: "
          f"{follow.choices[0].message.content!r}")


def expect_400(param_part, **kwargs):
    try:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, **kwargs)
    except openai.BadRequestError as e:
        check(param_part in str(e), f"{param_part!r} not in {e}")
        return
    raise AssertionError(f"no 400 for {kwargs}")


def check_bad_inputs():
    expect_400("/properties/a/minimum", response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer", "minimum": "0"}}}}})
    expect_400("not supported", response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}})
    expect_400("invalid regex", extra_body={"guided_regex": "[a-"})
    expect_400("invalid grammar", extra_body={"guided_grammar": "root ::= missing"})
    expect_400("not both", response_format={"type": "json_object"}, extra_body={"guided_regex": "a"})
    expect_400("response_format.type", response_format={"type": "yaml"})
    expect_400("tools[0]", tools=[{"type": "function", "function": {"name": "bad name!"}}])
    print("bad inputs: 400s naming the fault")


def check_slow_compile_does_not_stall_a_stream():
    """A grammar compiling for longer than --grammar-timeout (1 s) gets a 400 while a stream runs on."""
    gaps, stop = [], threading.Event()

    def stream():
        last = time.monotonic()
        for _ in client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=120, stream=True,
                                           temperature=0, extra_body={"ignore_eos": True}):
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        stop.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    while not gaps:
        time.sleep(0.05)
    rng = random.Random(1)
    choices = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(30)) for _ in range(7000)]
    started = time.monotonic()
    refused = False
    try:
        chat("hi", max_tokens=2, extra_body={"guided_choice": choices})
    except openai.BadRequestError as e:
        refused = "took longer" in str(e)
        check(refused, str(e))
    waited = time.monotonic() - started
    streamer.join()
    worst = max(gaps[1:])
    check(worst < 5.0, f"a stream stalled {worst:.2f} s")
    print(f"slow compile: {'refused' if refused else 'compiled in time'} after {waited:.2f} s; the stream's longest gap "
          f"{worst * 1000:.0f} ms over {len(gaps)} chunks")
    # It went on compiling and is cached: the same request now succeeds.
    for _ in range(60):
        try:
            chat("hi", max_tokens=2, extra_body={"guided_choice": choices})
            break
        except openai.BadRequestError:
            time.sleep(1)
    else:
        raise AssertionError("the slow grammar never landed in the cache")


def main():
    check_json_schemas()
    check_pydantic_parse()
    check_regex_choice_grammar_json_object()
    check_tools_required()
    check_bad_inputs()
    check_slow_compile_does_not_stall_a_stream()
    print("structured output client test: ok")


if __name__ == "__main__":
    main()
