"""OpenAI request bodies in, typed requests out; OpenAI-shaped errors.

Unknown fields are ignored, as OpenAI does; a known field of the wrong type or out of range is a 400
naming it (`param`) — every id and name included, whether k3 reads it or passes it over (`_optional_string`).
Text is the only content kind: a non-text part is refused by name. `metadata` is held to OpenAI's bounds
(`metadata`), here and in the other dialects.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from k3core.generation.structured import SchemaError
from k3core.text.openai_messages import TOOL_NAME, MessageError, k3_messages, tool_arguments
from k3core.generation.structured import schema_text

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
MAX_STOP = 4  # stop sequences per request, as OpenAI allows
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI allows
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' logprobs, as OpenAI allows
MAX_PROMPTS_PER_REQUEST = 64  # /v1/completions' prompts in one request, a choice each (lm-eval's batch_size > 1)
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's bounds on `metadata`
IDENTIFIERS = ("user", "safety_identifier", "prompt_cache_key")  # strings OpenAI defines; k3 passes them over


class ApiError(Exception):
    """An error the client gets as {"error": {"message", "type", "param", "code"}} with `status`."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
             429: "rate_limit_error", 500: "server_error", 503: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Sampling:
    """What a request asks of the sampler; None: the server's default for the mode. `top_k`, `min_p` and
    `repetition_penalty` are k3's own (extension fields, as llama.cpp's and vLLM's servers take them)."""

    temperature: float | None = None
    top_p: float = 1.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[dict, ...]            # k3 chat messages (role, content, thinking, tools, name)
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    tools: tuple[dict, ...] = ()          # OpenAI function declarations
    tool_choice: str | None = None        # None/"auto", "none", "required", or a function name
    thinking: bool = False
    logprobs: int | None = None           # alternatives per id (top_logprobs); None: no log-probabilities
    response_schema: str | None = None    # the reply is JSON satisfying this schema (its JSON text); None: any text
    schema_param: str = "response_format"  # where the request gave it (a schema that cannot be enforced is named so)
    parallel_calls: bool = True           # False: one tool call at most (parallel_tool_calls, disable_parallel_tool_use)
    tool_places: tuple[str, ...] = ()     # where the body gives each tool's schema ("tools[0].function.parameters")
    breakpoints: tuple[tuple[int, int], ...] = ()  # cache_control: (message index, offset in its content) to keep


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: tuple[str | tuple[int, ...], ...]  # each text or token ids; choice i is prompts[i]'s
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: int | None = None           # alternatives per id; None: no log-probabilities


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code="invalid_value")


def _number(body: dict, name: str, low: float, high: float, default=None, low_open: bool = False):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise _bad(name, f"must be a number, got {v!r}")
    if v < low or v > high or (low_open and v == low):
        raise _bad(name, f"must be in {'(' if low_open else '['}{low}, {high}], got {v!r}")
    return float(v)


def _integer(body: dict, name: str, low: int, high: int | None = None):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(name, f"must be an integer, got {v!r}")
    if v < low or (high is not None and v > high):
        raise _bad(name, f"must be an integer in {low}..{high if high is not None else '∞'}, got {v}")
    return v


def _string(block: dict, key: str, path: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise _bad(f"{path}.{key}", "must be a string")
    return value


def _optional_string(body: dict, key: str, path: str | None = None, limit: int | None = None) -> str | None:
    """An optional string field (an id, a name): absent or null is None; any other type, or one over `limit`
    characters, is a 400 naming it."""
    value, where = body.get(key), f"{path}.{key}" if path else key
    if value is not None and not isinstance(value, str):
        raise _bad(where, f"must be a string, got {type(value).__name__}")
    if value is not None and limit is not None and len(value) > limit:
        raise _bad(where, f"at most {limit} characters, got {len(value)}")
    return value


def metadata(body: dict) -> dict:
    """`metadata`: at most MAX_METADATA_PAIRS string pairs, keys at most MAX_METADATA_KEY characters and values at
    most MAX_METADATA_VALUE (OpenAI's bounds: a stored response keeps it, so it is bounded before it is kept)."""
    given = body.get("metadata")
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise _bad("metadata", f"must be an object of at most {MAX_METADATA_PAIRS} string key-value pairs")
    if len(given) > MAX_METADATA_PAIRS:
        raise _bad("metadata", f"at most {MAX_METADATA_PAIRS} key-value pairs, got {len(given)}")
    for key, value in given.items():
        if len(key) > MAX_METADATA_KEY:
            raise _bad("metadata", f"a key is at most {MAX_METADATA_KEY} characters, got one of {len(key)} "
                       f"({key[:MAX_METADATA_KEY]!r}…)")
        _optional_string(given, key, "metadata", MAX_METADATA_VALUE)
        if value is None:
            raise _bad(f"metadata.{key}", "must be a string, got null")
    return given


def _invalid(exc: MessageError) -> ApiError:
    """k3core's reading of a field refused: a 400 naming the field."""
    return ApiError(400, str(exc), param=exc.param, code="invalid_value")


def _arguments(text, param: str) -> dict:
    """A tool call's arguments: a JSON object given as a string (within the JSON limits), or a 400 naming `param`."""
    try:
        return tool_arguments(text, param)
    except MessageError as exc:
        raise _invalid(exc) from None


def _bool(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(name, f"must be true or false, got {v!r}")
    return v


def _model(body: dict) -> str:
    m = body.get("model")
    if not isinstance(m, str) or not m:
        raise ApiError(400, "model: required, the id GET /v1/models lists", param="model", code="missing_model")
    return m


def json_format(fmt, param: str, inner: str | None) -> tuple[str | None, str]:
    """A structured-output format object: (the schema's JSON text, or None for plain text; where the schema is).
    `{"type": "text"}`, `{"type": "json_object"}` (any JSON object), or `{"type": "json_schema", …}` with the
    schema under `inner` (chat completions: "json_schema", holding name, schema, strict) or at the top (None:
    Responses' `text.format`, Anthropic's `output_config.format`). `strict` is accepted either way: every
    schema is enforced."""
    if fmt is None:
        return None, param
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None, param
    if kind == "json_object":
        return schema_text({"type": "object"}), param
    if kind != "json_schema":
        raise _bad(f"{param}.type", f"must be \"text\", \"json_object\" or \"json_schema\", got {kind!r}")
    holder, where = fmt, param
    if inner is not None:
        holder, where = fmt.get(inner), f"{param}.{inner}"
        if not isinstance(holder, dict):
            raise _bad(where, "must be an object: {name, schema, strict?}")
    if holder.get("strict") is not None and not isinstance(holder["strict"], bool):
        raise _bad(f"{where}.strict", "must be true or false")
    _optional_string(holder, "name", where)
    schema = holder.get("schema", {})  # OpenAI: a json_schema without one takes any JSON
    try:
        return schema_text(schema, f"{where}.schema"), f"{where}.schema"
    except SchemaError as exc:
        raise ApiError(400, str(exc), param=exc.param, code="invalid_value") from None


def _not_served(body: dict) -> None:
    """Known OpenAI fields that would change what comes back, which k3 does not do: refused, never ignored."""
    for name in ("frequency_penalty", "presence_penalty"):
        v = body.get(name)
        if v not in (None, 0, 0.0):
            raise _bad(name, f"not served, got {v!r} (only 0 is accepted); send k3's own `repetition_penalty` field "
                       "instead, which makes every id already in the context less likely (a number > 0, 1 = off).")


def _only_one(body: dict, name: str, why: str) -> None:
    """`n`, `best_of`: k3 generates one sequence per request, so 1 (or absent) is the only value served."""
    v = body.get(name)
    if v is not None and (isinstance(v, bool) or v != 1):
        raise _bad(name, f"only {name} = 1 is served ({why}), got {v!r}")


def _sampling(body: dict, max_tokens_limit: int, least_tokens: int = 1) -> Sampling:
    _not_served(body)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
        if len(stop) > MAX_STOP:
            raise _bad("stop", f"at most {MAX_STOP} stop sequences, got {len(stop)}")
    else:
        raise _bad("stop", f"must be a string or a list of strings, got {stop!r}")
    _only_one(body, "n", "one choice per request")
    given = [k for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None]
    max_tokens = _integer(body, given[0], least_tokens, max_tokens_limit) if given else None
    return Sampling(temperature=_number(body, "temperature", 0.0, 2.0),
                    top_p=_number(body, "top_p", 0.0, 1.0, 1.0, low_open=True), max_tokens=max_tokens, stop=stops,
                    seed=_integer(body, "seed", 0, 2 ** 64 - 1), top_k=_integer(body, "top_k", 0) or 0,
                    min_p=_number(body, "min_p", 0.0, 0.999999, 0.0),
                    repetition_penalty=_number(body, "repetition_penalty", 0.0, 100.0, 1.0, low_open=True))


def _include_usage(body: dict) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise _bad("stream_options", f"must be an object, got {opts!r}")
    return _bool(opts, "include_usage") if "include_usage" in opts else False


K3_NAMES = {"thinking": "reasoning_content", "tools": "tool_calls"}  # an assistant's fields: k3's name -> OpenAI's


def request_param(param: str) -> str:
    """A field as k3's chat layer names it ("messages[1].thinking") named as the request does."""
    head, dot, field = param.rpartition(".")
    return f"{head}.{K3_NAMES.get(field, field)}" if dot else param


def _messages(body: dict) -> tuple[dict, ...]:
    """The request's messages as k3's (k3core/text/openai_messages.py, the one reading of them)."""
    try:
        return tuple(k3_messages(body.get("messages")))
    except MessageError as exc:
        raise _invalid(exc) from None


def _tools(body: dict) -> tuple[tuple[dict, ...], str | None]:
    tools, choice = body.get("tools"), body.get("tool_choice")
    declared = []  # each with the place of its schema in the body (`place`), which the ChatRequest keeps apart
    if tools is not None:
        if not isinstance(tools, list):
            raise _bad("tools", "must be a list of tools")
        for j, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not TOOL_NAME.match(fn["name"]):
                raise _bad(f"tools[{j}].function.name", "each tool is {type: function, function: {name, description?, "
                           "parameters?}} with a name of letters, digits, _ and -")
            if "parameters" in fn and not isinstance(fn["parameters"], dict):
                raise _bad(f"tools[{j}].function.parameters", "must be a JSON Schema object")
            _optional_string(fn, "description", f"tools[{j}].function")
            declared.append({k: fn[k] for k in ("name", "description", "parameters") if k in fn}
                            | {"place": f"tools[{j}].function.parameters"})
    if choice is None or choice == "auto":
        return tuple(declared), None
    if choice in ("none", "required"):
        if choice == "required" and not declared:
            raise _bad("tool_choice", "'required' needs tools to choose from")
        return tuple(declared), choice
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or name not in {d["name"] for d in declared}:
        raise _bad("tool_choice", "must be 'none', 'auto', 'required' or {type: function, function: {name}} naming one "
                   "of the tools")
    return tuple(declared), name


def _thinking(body: dict) -> bool:
    effort, thinking = body.get("reasoning_effort"), body.get("thinking")
    on = False
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise _bad("reasoning_effort", f"must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}")
        on = effort not in ("none", "minimal")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else thinking
        if kind not in ("enabled", "disabled", True, False):
            raise _bad("thinking", f"must be {{\"type\": \"enabled\"}} or {{\"type\": \"disabled\"}}, got {thinking!r}")
        on = kind in ("enabled", True)
    return on


def _chat_logprobs(body: dict) -> int | None:
    """`logprobs: true` and `top_logprobs` 0..20 alternatives: the alternatives per id, or None when off."""
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if not _bool(body, "logprobs"):
        if top is not None:
            raise _bad("top_logprobs", "needs \"logprobs\": true")
        return None
    return top or 0


def placed(tools) -> tuple[tuple[dict, ...], tuple[str, ...]]:
    """Declarations that carry their schema's place in the body (`place`): the declarations without it, and the
    places."""
    return (tuple({k: v for k, v in t.items() if k != "place"} for t in tools),
            tuple(t["place"] for t in tools))


def chat_request(body: Any, max_tokens_limit: int) -> ChatRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    tools, choice = _tools(body)
    tools, places = placed(tools)
    schema, where = json_format(body.get("response_format"), "response_format", "json_schema")
    for name in IDENTIFIERS:
        _optional_string(body, name)
    metadata(body)
    return ChatRequest(model=_model(body), messages=_messages(body), sampling=_sampling(body, max_tokens_limit),
                       stream=_bool(body, "stream"), include_usage=_include_usage(body), tools=tools,
                       tool_choice=choice, thinking=_thinking(body), logprobs=_chat_logprobs(body),
                       response_schema=schema, schema_param=where,
                       parallel_calls=_bool(body, "parallel_tool_calls", True), tool_places=places)


def _one_prompt(prompt, param: str) -> str | tuple[int, ...]:
    """One prompt: non-empty text, or token ids (a non-empty list of integers, as OpenAI takes them)."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return tuple(prompt)
    if not isinstance(prompt, str) or not prompt:
        raise _bad(param, "must be a non-empty string or list of token ids")
    return prompt


def prompt_param(count: int, index: int) -> str:
    """How an error names prompt `index` of `count`: `prompt[i]` among several, `prompt` when it is the one."""
    return f"prompt[{index}]" if count > 1 else "prompt"


def _prompts(prompt) -> tuple[str | tuple[int, ...], ...]:
    """The prompts: one (text, or token ids), or a list of them, at most MAX_PROMPTS_PER_REQUEST."""
    if not (isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt)):
        return (_one_prompt(prompt, "prompt"),)
    if len(prompt) > MAX_PROMPTS_PER_REQUEST:
        raise _bad("prompt", f"at most {MAX_PROMPTS_PER_REQUEST} prompts per request, got {len(prompt)}")
    return tuple(_one_prompt(p, prompt_param(len(prompt), i)) for i, p in enumerate(prompt))


def completion_request(body: Any, max_tokens_limit: int) -> CompletionRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    prompts, stream, echo = _prompts(body.get("prompt")), _bool(body, "stream"), _bool(body, "echo")
    if body.get("suffix") is not None:
        raise _bad("suffix", "insertion (suffix) is not served")
    if stream and len(prompts) > 1:
        raise _bad("stream", f"a stream serves one prompt, got {len(prompts)}: send them without `stream` (a choice "
                   "each) or in a request each")
    _only_one(body, "best_of", "one completion generated per request, none to choose among")
    sampling = _sampling(body, max_tokens_limit, least_tokens=0)
    if sampling.max_tokens == 0 and not echo:
        raise _bad("max_tokens", f"0 generates nothing, which only `echo: true` makes meaningful (the prompt comes "
                   f"back, scored with `logprobs`); without echo give 1..{max_tokens_limit}")
    return CompletionRequest(model=_model(body), prompts=prompts, sampling=sampling, stream=stream,
                             include_usage=_include_usage(body), echo=echo,
                             logprobs=_integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS))
