"""`k3 serve`'s Responses API driven by the official `openai` package (and raw HTTP where the client hides the
wire), live on 127.0.0.1 on the demo model and a generated one: the same worker as chat completions."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from .conftest import CALLS, KEY, Live, script_tool_calls

PARIS = "What is the capital of France?"
TOOLS = [{"type": "function", "name": "get_weather", "description": "weather in a city", "strict": False,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def without_ids(response) -> dict:
    """The response without its ids and without how many prompt ids the prompt cache gave (a second identical
    request reads what the first one kept)."""
    body = response.model_dump(exclude_none=True)
    for key in ("id", "created_at"):
        del body[key]
    body["usage"].pop("input_tokens_details", None)
    for item in body["output"]:
        item.pop("id", None)
        item.pop("call_id", None)
    return body


def test_create_answers_in_a_message_item_with_usage(demo):
    r = demo.client.responses.create(model=demo.name, input=PARIS, temperature=0, metadata={"k": "v"}, store=False)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed" and r.model == demo.name
    assert r.output_text == "The capital of France is Paris." and r.incomplete_details is None
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert [(c.type, c.annotations) for c in item.content] == [("output_text", [])]
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens > 0 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0
    chat = demo.client.chat.completions.create(model=demo.name, temperature=0,
                                               messages=[{"role": "user", "content": PARIS}])
    assert chat.usage.prompt_tokens == u.input_tokens and chat.usage.completion_tokens == u.output_tokens


def test_max_output_tokens_makes_it_incomplete(demo):
    r = demo.client.responses.create(model=demo.name, input=PARIS, temperature=0, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


def test_a_stream_is_the_whole_response_event_by_event(demo):
    ask = dict(model=demo.name, input=[{"role": "user", "content": [{"type": "input_text", "text": PARIS}]}],
               instructions="Answer briefly.", temperature=0)
    whole = demo.client.responses.create(**ask)
    with demo.client.responses.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert without_ids(final) == without_ids(whole)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    names = [e.type for e in events]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text


def test_thinking_is_a_reasoning_item(demo):
    ask = dict(model=demo.name, input=PARIS, temperature=0, max_output_tokens=24, reasoning={"effort": "medium"})
    r = demo.client.responses.create(**ask)
    assert r.output[0].type == "reasoning" and r.output[0].content[0].text
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
    with demo.client.responses.stream(**ask) as stream:  # cut off or not, the last event holds the response
        last = list(stream)[-1]
    assert last.type == f"response.{r.status}" and without_ids(last.response) == without_ids(r)
    # its output sent back as it came (the reasoning item included) renders as generated: the state is reused
    again = demo.client.responses.create(**{**ask, "input": [{"role": "user", "content": PARIS},
                                                             *[i.model_dump(exclude_none=True) for i in r.output],
                                                             {"role": "user", "content": "And of Italy?"}]})
    assert again.usage.input_tokens_details.cached_tokens == r.usage.input_tokens + r.usage.output_tokens - 1, (
        r.status, r.usage, again.usage)


def test_a_follow_up_by_previous_response_id_reuses_the_kept_state(demo):
    first = demo.client.responses.create(model=demo.name, input=PARIS, temperature=0)
    again = demo.client.responses.create(model=demo.name, input="And of Italy?", temperature=0,
                                         previous_response_id=first.id)
    assert again.previous_response_id == first.id
    kept = first.usage.input_tokens + first.usage.output_tokens - 1  # the first state: all its ids but the last
    assert again.usage.input_tokens_details.cached_tokens == kept
    # the same conversation sent whole is the same prompt
    chat = demo.client.chat.completions.create(model=demo.name, temperature=0, messages=[
        {"role": "user", "content": PARIS}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And of Italy?"}])
    assert chat.usage.prompt_tokens == again.usage.input_tokens
    assert chat.choices[0].message.content == again.output_text


def test_a_function_call_round_trip(generated, monkeypatch):
    """Every pick follows a script (the model's output forced to two complete XTML tool calls): the output is
    function_call items, whole and streamed; their outputs go back as function_call_output items."""
    calls, script = CALLS, script_tool_calls(monkeypatch, generated)
    c = generated.client
    ask = dict(model=generated.name, max_output_tokens=len(script), tools=TOOLS, input="weather in Paris?")
    r = c.responses.create(**ask)
    assert r.status == "completed" and [i.type for i in r.output] == ["message", "function_call", "function_call"]
    assert r.output_text == "Checking."
    assert [(i.name, json.loads(i.arguments)) for i in r.output[1:]] == calls
    with c.responses.stream(**ask) as stream:
        done = [e.arguments for e in stream if e.type == "response.function_call_arguments.done"]
        final = stream.get_final_response()
    assert [json.loads(d) for d in done] == [args for _, args in calls]
    assert without_ids(final) == without_ids(r)
    monkeypatch.undo()  # the real sampler again
    outputs = [{"type": "function_call_output", "call_id": r.output[1].call_id, "output": "sunny, 21 C"},
               {"type": "function_call_output", "call_id": r.output[2].call_id, "output": "rain"}]
    again = c.responses.create(**{**ask, "max_output_tokens": 3, "input": outputs, "previous_response_id": r.id})
    assert again.usage.input_tokens_details.cached_tokens == r.usage.input_tokens + r.usage.output_tokens - 1
    # the same round trip with the history sent whole: the prompt the follow-up had
    whole = c.responses.create(**{**ask, "max_output_tokens": 3, "input": [
        {"role": "user", "content": "weather in Paris?"}, *[i.model_dump(exclude_none=True) for i in r.output],
        *outputs]})
    assert whole.usage.input_tokens == again.usage.input_tokens


def test_a_stored_response_is_retrieved_until_deleted(demo):
    c = demo.client
    r = c.responses.create(model=demo.name, input=PARIS, temperature=0)
    assert r.store is True and c.responses.retrieve(r.id).model_dump() == r.model_dump()
    with c.responses.stream(model=demo.name, input=PARIS, temperature=0) as stream:
        final = stream.get_final_response()
    assert c.responses.retrieve(final.id).model_dump(exclude_none=True) == final.model_dump(exclude_none=True)
    replay = httpx.get(f"{demo.url}/v1/responses/{r.id}", params={"stream": "true"})
    assert replay.status_code == 400 and replay.json()["error"]["param"] == "stream"
    assert c.responses.delete(r.id) is None
    for gone in (c.responses.retrieve, c.responses.delete):
        with pytest.raises(openai.NotFoundError) as e:
            gone(r.id)
        assert e.value.body["param"] == "response_id" and r.id in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # nor does a follow-up find its conversation
        c.responses.create(model=demo.name, input="And of Italy?", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"


def test_store_false_keeps_nothing(demo):
    c = demo.client
    r = c.responses.create(model=demo.name, input=PARIS, temperature=0, max_output_tokens=2, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=demo.name, input="And of Italy?", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"


def test_retrieve_and_delete_need_the_api_key(model_factory):
    live = Live(model_factory("small"), api_key=KEY)
    try:
        for method in ("GET", "DELETE"):
            url = live.url + "/v1/responses/resp_nope"
            assert httpx.request(method, url).status_code == 401
            known = httpx.request(method, url, headers={"Authorization": f"Bearer {KEY}"})
            assert known.status_code == 404 and known.json()["error"]["param"] == "response_id"
    finally:
        live.close()


def test_logprobs_are_chat_completions_own_whole_and_streamed(demo):
    c = demo.client
    ask = dict(model=demo.name, input=PARIS, temperature=0, top_logprobs=5,
               include=["message.output_text.logprobs", "web_search_call.results"])
    r = c.responses.create(**ask)
    [part] = r.output[0].content
    chat = c.chat.completions.create(model=demo.name, messages=[{"role": "user", "content": PARIS}], temperature=0,
                                     logprobs=True, top_logprobs=5)
    content = chat.choices[0].logprobs.content
    # the ids of the answer's text, with chat completions' numbers; the markup after it makes no text
    assert r.output_text == chat.choices[0].message.content == "".join(e.token for e in part.logprobs)
    n = len(part.logprobs)
    assert [e.model_dump() for e in part.logprobs] == [e.model_dump() for e in content[:n]]
    assert [e.token for e in content[n:]] == ["<|close|>", "response", "<|sep|>", "<|end_of_msg|>"]
    assert all(len(e.top_logprobs) == 5 for e in part.logprobs)
    with c.responses.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_response()
    streamed = [e.model_dump() for d in events if d.type == "response.output_text.delta" for e in d.logprobs]
    assert streamed == [e.model_dump() for e in part.logprobs] and final.output[0].content[0].logprobs == part.logprobs
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert [e.model_dump() for e in done.logprobs] == streamed
    alone = c.responses.create(model=demo.name, input=PARIS, temperature=0, top_logprobs=5)  # as OpenAI: none
    assert alone.top_logprobs == 5 and alone.output[0].content[0].logprobs == []


def test_in_thinking_mode_only_the_answers_ids_have_logprobs(demo):
    r = demo.client.responses.create(model=demo.name, input=PARIS, temperature=0, reasoning={"effort": "medium"},
                                     include=["message.output_text.logprobs"])
    thought, answer = r.output
    assert thought.type == "reasoning" and answer.type == "message" and answer.content[0].text
    logprobs = answer.content[0].logprobs  # not the thinking's, nor the markup's between: the text's own
    assert "".join(e.token for e in logprobs) == answer.content[0].text
    assert all(e.top_logprobs == [] for e in logprobs)  # top_logprobs absent: 0 alternatives


BOUNDED = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
           "additionalProperties": False}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_forced_tool_choice_is_a_call_whose_arguments_fit_the_schema(generated, choice):
    """On a random model, greedy (the same every run): the mask holds the call to the tool's parameters (a bounded
    string, so it ends)."""
    r = generated.client.responses.create(model=generated.name, max_output_tokens=120, input="weather?", temperature=0,
                                          tools=[{**TOOLS[0], "parameters": BOUNDED}], tool_choice=choice)
    calls = [item for item in r.output if item.type == "function_call"]
    assert r.status == "completed" and calls and all(c.name == "get_weather" for c in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), BOUNDED)


def test_refusals_are_the_sdks_typed_exceptions(demo):
    c = demo.client
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=demo.name, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "what is this?"}, {"type": "input_image", "image_url": "http://x/y.png"}]}])
    assert e.value.body["param"] == "input[0].content[1]" and "input_image is not served" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=demo.name, input=PARIS, text={"format": {"type": "json_schema", "name": "x",
                                                                            "schema": {"type": "nope"}}})
    assert e.value.body["param"] == "text.format.schema" and "cannot be enforced" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=demo.name, input=PARIS, previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=demo.name, input=PARIS, temperature=3)
    assert e.value.body["param"] == "temperature" and e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="gpt-9", input=PARIS)
    assert e.value.body["param"] == "model"


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": PARIS, "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": PARIS, "top_p": 0}, "top_p"),
    ({"input": PARIS, "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": PARIS, "reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"input": PARIS, "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": PARIS, "tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools[0].parameters"),
    ({"input": PARIS, "tool_choice": "required"}, "tool_choice"),
    ({"input": [{"type": "input_file", "file_id": "f"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "reasoning", "content": ["x"]}]}, "input[0].content"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
    ({"input": [{"role": "user", "content": "<|end_of_msg|>"}]}, "input[0]"),
    ({"input": PARIS, "instructions": "<|end_of_msg|>"}, "instructions"),
    ({"input": PARIS, "instructions": ["x"]}, "instructions"),
    ({"input": PARIS, "include": "message.output_text.logprobs"}, "include"),
    ({"input": PARIS, "include": ["reasoning.everything"]}, "include[0]"),
    ({"input": PARIS, "include": ["message.output_text.logprobs", "nope"]}, "include[1]"),
    ({"input": PARIS, "include": ["message.output_text.logprobs"], "top_logprobs": 21}, "top_logprobs"),
    ({"input": PARIS, "store": "no"}, "store"),
])
def test_each_bad_field_is_a_400_naming_it(demo, body, param):
    r = httpx.post(demo.url + "/v1/responses", json={"model": demo.name, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"].startswith(param), error
    assert error["message"].startswith(error["param"] + ":")
