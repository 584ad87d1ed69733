"""Two things wrong with a JSON schema that llguidance compiles without complaint and then fails on mid-reply,
found before generation (structured.py's `schema_text` turns each problem into a SchemaError naming the field):

- `no_finite_instance`: a `$ref` recursion with no way out (`{"$ref": "#"}`, a→b→a, an object that requires a
  child of its own kind, an array of its own kind with `minItems: 1`): no finite JSON satisfies the schema, and
  llguidance either allows nothing but the stop id or builds the forced prefix without end ("Too many items").
- `pattern_problem`: a `pattern` whose automaton llguidance's lexer cannot build (`^a{1000000}$` passes its
  `initial_lexer_fuel`), found by building it alone over a 257-id byte vocabulary.

`no_finite_instance` is a least fixed point over an AND/OR graph of the schema's subschemas (the "productive
symbols" of a grammar). It over-approximates "has a finite instance": every keyword it does not model counts as
satisfiable, so it refuses only a schema that truly has none. Contradictions without recursion (`false`, two
types under `allOf`) are left to llguidance, which refuses them at compile by name. Checked by
tests/generation/test_schema_checks.py (against the `jsonschema` library) and tests/faults/test_requests.py.
"""
from __future__ import annotations

import functools
import json
from urllib.parse import unquote

Path = tuple[str, ...]  # a subschema's place, as JSON pointer parts (unescaped)


def pointer(path: Path) -> str:
    return "#" + "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


class _Graph:
    """A node per subschema (and per anyOf/oneOf): it holds when a finite instance may satisfy it. An AND node
    holds when all it needs hold; an OR node when one does. Built without recursion: a subschema met is queued."""

    def __init__(self, root: dict):
        self.root = root
        self.needs: list[list[int]] = []
        self.is_or: list[bool] = []
        self.at: dict[Path, int] = {}
        self.queue: list[tuple[Path, object]] = []
        self.refs: list[tuple[Path, str, Path]] = []  # (where a $ref is, its text, the path it names), reachable

    def _new(self, is_or: bool, needs: list[int] | None = None) -> int:
        self.needs.append(needs or [])
        self.is_or.append(is_or)
        return len(self.needs) - 1

    def node(self, value, path: Path) -> int:
        if path not in self.at:
            self.at[path] = self._new(False)
            self.queue.append((path, value))
        return self.at[path]

    def build(self) -> None:
        while self.queue:
            path, value = self.queue.pop()
            if isinstance(value, dict):  # true, false and anything else: nothing modelled (false is llguidance's)
                self.needs[self.at[path]] = self._needs(value, path)

    def _needs(self, s: dict, path: Path) -> list[int]:
        needs = []
        ref = s.get("$ref")
        target = self._resolve(ref) if isinstance(ref, str) else None
        if target is not None:
            self.refs.append((path, ref, target[0]))
            needs.append(self.node(target[1], target[0]))
        for j, sub in enumerate(s.get("allOf") if isinstance(s.get("allOf"), list) else ()):
            needs.append(self.node(sub, path + ("allOf", str(j))))
        for key in ("anyOf", "oneOf"):
            options = s.get(key)
            if isinstance(options, list) and options:
                needs.append(self._new(True, [self.node(sub, path + (key, str(j))) for j, sub in enumerate(options)]))
        kind = s.get("type")
        kinds = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) and all(
            isinstance(k, str) for k in kind) else None
        if kinds == {"object"}:  # `required` binds objects only: with another type allowed, that type is a way out
            props, required = s.get("properties"), s.get("required")
            if isinstance(props, dict) and isinstance(required, list):
                needs += [self.node(props[name], path + ("properties", name)) for name in required
                          if isinstance(name, str) and name in props]
        elif kinds == {"array"}:
            needs += self._items(s, path)
        return needs

    def _items(self, s: dict, path: Path) -> list[int]:
        """An array must hold its first minItems items: prefixItems (or draft-07's list `items`), then the rest."""
        least = s.get("minItems", 0)
        least = least if isinstance(least, int) and not isinstance(least, bool) else 0
        if isinstance(s.get("prefixItems"), list):
            head, head_key, rest_key = s["prefixItems"], "prefixItems", "items"
        elif isinstance(s.get("items"), list):
            head, head_key, rest_key = s["items"], "items", "additionalItems"
        else:
            head, head_key, rest_key = [], "", "items"
        out = [self.node(head[k], path + (head_key, str(k))) for k in range(min(least, len(head)))]
        if least > len(head) and rest_key in s:
            out.append(self.node(s[rest_key], path + (rest_key,)))
        return out

    def _resolve(self, ref: str) -> tuple[Path, object] | None:
        """The subschema a `#`-pointer $ref names; None for any other (an anchor, another document): not modelled."""
        if ref != "#" and not ref.startswith("#/"):
            return None
        path, value = (), self.root
        for part in ref[2:].split("/") if ref != "#" else ():
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                return None
            path += (part,)
        return path, value

    def solve(self) -> list[bool]:
        """Which nodes hold: the least fixed point, by counting the needs still open (linear in the graph)."""
        open_ = [1 if o else len(n) for o, n in zip(self.is_or, self.needs)]
        users: list[list[int]] = [[] for _ in self.needs]
        for i, needs in enumerate(self.needs):
            for k in needs:
                users[k].append(i)
        holds = [False] * len(self.needs)
        todo = [i for i, n in enumerate(open_) if n == 0]
        while todo:
            i = todo.pop()
            if holds[i]:
                continue
            holds[i] = True
            for user in users[i]:
                open_[user] -= 1
                if open_[user] == 0:
                    todo.append(user)
        return holds


def _has_nested_id(schema: dict) -> bool:
    """A `$id` below the root starts another resource, against which its `#` pointers resolve: not modelled."""
    stack = [v for v in schema.values() if isinstance(v, (dict, list))]
    while stack:
        value = stack.pop()
        if isinstance(value, dict) and "$id" in value:
            return True
        stack += [v for v in (value.values() if isinstance(value, dict) else value) if isinstance(v, (dict, list))]
    return False


def no_finite_instance(schema) -> str | None:
    """Why no finite JSON value satisfies `schema` (a $ref recursion with no way out), or None when one may."""
    if not isinstance(schema, dict) or _has_nested_id(schema):
        return None
    graph = _Graph(schema)
    root = graph.node(schema, ())
    graph.build()
    holds = graph.solve()
    if holds[root]:
        return None
    stuck = [r for r in graph.refs if not holds[graph.at[r[2]]]]
    inside = [r for r in stuck if r[0][:len(r[2])] == r[2]]  # a $ref inside what it names: the recursion itself
    at, ref, target = (inside or stuck)[-1]
    return (f"no finite JSON value satisfies it: the $ref {ref!r} at {pointer(at)} recurses with no way out (a "
            f"value matching {pointer(target)} would have to hold another one, without end)")


SUBSCHEMAS = ("additionalProperties", "items", "additionalItems", "contains", "not", "if", "then", "else",
              "propertyNames", "unevaluatedItems", "unevaluatedProperties")
SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def patterns(schema) -> list[tuple[str, str]]:
    """Every `pattern` in the schema's subschemas, with its place (a JSON pointer)."""
    out, stack = [], [((), schema)]
    while stack:
        path, s = stack.pop()
        if not isinstance(s, dict):
            continue
        if isinstance(s.get("pattern"), str):
            out.append((pointer(path + ("pattern",)), s["pattern"]))
        stack += [(path + (k,), s[k]) for k in SUBSCHEMAS if isinstance(s.get(k), dict)]
        stack += [(path + (k, str(j)), v) for k in SUBSCHEMA_LISTS if isinstance(s.get(k), list)
                  for j, v in enumerate(s[k])]
        stack += [(path + (k, name), v) for k in SUBSCHEMA_MAPS if isinstance(s.get(k), dict)
                  for name, v in s[k].items()]
    return sorted(out)


@functools.lru_cache(maxsize=1)
def _byte_vocabulary():
    import llguidance

    return llguidance.LLTokenizer.from_tiktoken(encoder={bytes([b]): b for b in range(256)},
                                                special_tokens={"<|stop|>": 256}, pattern=".", eos_token=256,
                                                n_vocab=257)


@functools.lru_cache(maxsize=1024)
def pattern_problem(regex: str) -> str | None:
    """Why llguidance cannot enforce a string held to `regex` (its first line), or None: the string's opening quote,
    then the mask that builds the pattern's automaton, over a byte vocabulary (the lexer's limits are the same)."""
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_lark(
        "start: s\ns: %json " + json.dumps({"type": "string", "pattern": regex}) + "\n")
    matcher = llguidance.LLMatcher(_byte_vocabulary(), grammar, log_level=0)
    matcher.compute_bitmask()
    if not matcher.is_error():
        matcher.consume_token(ord('"'))
        matcher.compute_bitmask()
    return engine_message(matcher.get_error()).removeprefix("failed to compile JSON schema: ") \
        if matcher.is_error() else None


def engine_message(text: str) -> str:
    """llguidance's message without its position prefix, its state dump and the grammar listing after it (a regex
    parse error keeps its `error:` line)."""
    lines = text.strip().splitlines()
    first = lines[0] if lines else "unknown error"
    first = first.split(": ", 1)[1] if first.startswith("at ") and ": " in first else first
    if first.endswith(":"):
        first += "".join(" " + line.strip()[7:] for line in lines[1:8] if line.strip().startswith("error: "))
    return first
