"""Write transcripts.jsonl: chat conversations for `k3 bench drafts --transcripts`, built from text that ships
with the machine — CPython's standard library (its sources and pydoc_data/topics.py, the language reference's
text; PSF License) and Debian's /usr/share/common-licenses/{Apache-2.0,BSD}. Nothing is downloaded.

Five kinds, each conversation one JSON line {"kind", "source", "messages"} in OpenAI's chat shape:
  rewrite         a file shown, a mechanical change asked; the reply is the whole file with it applied
  search_replace  the same requests answered with SEARCH/REPLACE blocks quoting the original lines
  tool_loop       an agent's tool calls (list_files, grep, read_file) with JSON arguments, tool results
                  (JSON, file lines), then an answer quoting them; sessions of four on the same package
  quote           a document pasted, sentences with a word asked for; the reply quotes them verbatim
  plain           a question (maybe with a code snippet) answered from a text the prompt does not show

Deterministic (seed SEED): the same interpreter (CPython 3.11.7) and the same licence files give the same bytes.
`--check` regenerates in memory and compares with the file instead of writing it (exit 1 on a difference).
See README.md for what each kind is and the licences.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import json
import platform
import random
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SEED = 26
OUT = Path(__file__).with_name("transcripts.jsonl")
STDLIB = Path(sysconfig.get_paths()["stdlib"])
SOURCE_PREFIX = f"cpython-{platform.python_version()}/Lib/"
LICENSES = Path("/usr/share/common-licenses")
LICENSE_FILES = ("Apache-2.0", "BSD")          # permissive texts only: no GPL-family file is read
# never shown as files: tests, other packages' site-packages, generated tables (encodings), the reference's text
# (pydoc_data: the prose of `quote` and `plain`), demos, and the deprecated lib2to3 and distutils, whose many
# near-identical files would repeat each other across conversations
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "encodings", "pydoc_data",
                "turtledemo", "lib2to3", "distutils"}
TOOL_PACKAGES = ("json", "email", "http", "logging", "importlib", "concurrent/futures", "xml/etree", "urllib",
                 "wsgiref", "venv")
SESSIONS, PER_SESSION = 7, 4
COUNTS = {"rewrite": 26, "search_replace": 26, "quote": 26, "plain": 26}
NO_COPY = 32  # a plain answer shares no run of this many characters with its prompt
MIN_DOCUMENT = 1200  # characters of a document pasted for quoting, at least


# ---- sources -----------------------------------------------------------------------------------------------

def source_name(rel: str) -> str:
    return SOURCE_PREFIX + rel


def stdlib_modules(low: int, high: int, skip_packages=()) -> list[str]:
    """Standard-library .py files of low..high bytes (paths relative to Lib, sorted), outside SKIPPED_DIRS and
    the packages the tool loops browse."""
    out = []
    for path in sorted(STDLIB.rglob("*.py")):
        rel = path.relative_to(STDLIB).as_posix()
        parts = rel.split("/")
        if SKIPPED_DIRS & set(parts[:-1]) or any(rel.startswith(p + "/") for p in skip_packages):
            continue
        if low <= path.stat().st_size <= high:
            out.append(rel)
    return out


def read_stdlib(rel: str) -> str:
    return (STDLIB / rel).read_text(encoding="utf-8")


def reference_topics() -> dict[str, str]:
    from pydoc_data.topics import topics
    return topics


def paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text.strip("\n")) if p.strip()]


def chunks(text: str, limit: int) -> list[str]:
    """`text` cut at paragraph boundaries into pieces of at most about `limit` characters."""
    out, current = [], []
    for p in paragraphs(text):
        if current and len("\n\n".join(current + [p])) > limit:
            out.append("\n\n".join(current))
            current = []
        current.append(p)
    if current:
        out.append("\n\n".join(current))
    return out


def without_heading(topic: str) -> str:
    """A reference topic's text after its title and the line of asterisks under it."""
    lines = topic.split("\n")
    return "\n".join(lines[2:]).strip("\n") if len(lines) > 2 and set(lines[1]) == {"*"} else topic


# ---- mechanical edits --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Edit:
    request: str   # what the user asks for
    summary: str   # what the reply says was done
    text: str      # the file with the edit applied


def defined_functions(tree) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def rename_function(src: str, rng: random.Random) -> Edit | None:
    tree = ast.parse(src)
    names = [f.name for f in defined_functions(tree)]
    once = sorted({n for n in names if names.count(n) == 1 and not n.startswith("__") and len(n) > 3})
    used = [n for n in once if len(re.findall(rf"\b{re.escape(n)}\b", src)) >= 2]
    if not used:
        return None
    old = rng.choice(used)
    new = rng.choice([f"{old}_impl", f"do_{old.lstrip('_')}", f"{old}2", f"_{old}" if not old.startswith("_")
                      else old.lstrip("_") + "_private"])
    if re.search(rf"\b{re.escape(new)}\b", src):
        return None
    count = len(re.findall(rf"\b{re.escape(old)}\b", src))
    return Edit(f"Rename the function `{old}` to `{new}`, including every place that uses it",
                f"`{old}` renamed to `{new}` ({count} occurrences)", re.sub(rf"\b{re.escape(old)}\b", new, src))


def docstring_phrase(name: str) -> str:
    words = name.strip("_").split("_")
    return " ".join([words[0].capitalize(), *words[1:]]) + "."


def add_docstring(src: str, rng: random.Random) -> Edit | None:
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    bare = [f for f in defined_functions(tree)
            if not ast.get_docstring(f) and f.body[0].lineno > f.lineno and not getattr(f.body[0], "decorator_list", [])
            and not f.name.startswith("__") and f.body[0].col_offset > f.col_offset]
    if not bare:
        return None
    f = rng.choice(bare)
    first = lines[f.body[0].lineno - 1]
    indent = first[:len(first) - len(first.lstrip())]
    phrase = docstring_phrase(f.name)
    lines.insert(f.body[0].lineno - 1, f'{indent}"""{phrase}"""\n')
    return Edit(f'Add the docstring """{phrase}""" to `{f.name}`', f"a docstring added to `{f.name}`", "".join(lines))


def change_constant(src: str, rng: random.Random) -> Edit | None:
    tree = ast.parse(src)
    found = [n for n in tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1
             and isinstance(n.targets[0], ast.Name) and n.targets[0].id.isupper()
             and isinstance(n.value, ast.Constant) and type(n.value.value) is int and n.lineno == n.end_lineno]
    if not found:
        return None
    n = rng.choice(found)
    old = n.value.value
    new = rng.choice([old * 2, old + 1, old * 10]) if old else 1
    lines = src.splitlines(keepends=True)
    line = lines[n.lineno - 1]
    lines[n.lineno - 1] = line[:n.value.col_offset] + repr(new) + line[n.value.end_col_offset:]
    name = n.targets[0].id
    return Edit(f"Change `{name}` from {old} to {new}", f"`{name}` set to {new}", "".join(lines))


EDITS = (rename_function, add_docstring, change_constant)


def edits(src: str, rng: random.Random, n: int) -> list[Edit]:
    """Up to `n` edits applied one after another (each Edit's text includes the ones before it)."""
    out = []
    for make in rng.sample(EDITS, len(EDITS)):
        if len(out) == n:
            break
        edit = make(out[-1].text if out else src, rng)
        if edit is not None:
            out.append(edit)
    return out


def joined(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def requests(done: list[Edit]) -> str:
    """The edits asked for in one sentence."""
    return joined([done[0].request, *(lower_first(e.request) for e in done[1:])])


def fenced(text: str, lang: str = "python") -> str:
    return f"```{lang}\n{text if text.endswith(chr(10)) else text + chr(10)}```"


# ---- rewrite -----------------------------------------------------------------------------------------------

REWRITE_SYSTEM = ("You are a careful coding assistant. When asked to change a file, reply with the complete updated "
                  "file in one code block, changing nothing else.")


def rewrite(rel: str, rng: random.Random) -> dict | None:
    src = read_stdlib(rel)
    first = edits(src, rng, rng.choice([1, 1, 2]))
    if not first:
        return None
    messages = [{"role": "system", "content": REWRITE_SYSTEM},
                {"role": "user", "content": f"Here is `{rel}`:\n\n{fenced(src)}\n\n"
                                            f"{requests(first)}. Reply with the whole file."},
                {"role": "assistant", "content": f"Here is the whole of `{rel}` with "
                                                 f"{joined([e.summary for e in first])}:\n\n{fenced(first[-1].text)}"}]
    if rng.random() < 0.35:
        more = edits(first[-1].text, rng, 1)
        if more:
            messages += [{"role": "user", "content": f"Thanks. Now also: {lower_first(more[0].request)}. "
                                                     "The whole file again, please."},
                         {"role": "assistant", "content": f"Done — {more[0].summary}. The updated file:\n\n"
                                                          f"{fenced(more[0].text)}"}]
    return {"kind": "rewrite", "source": source_name(rel), "messages": messages}


# ---- search_replace ----------------------------------------------------------------------------------------

SEARCH_REPLACE_SYSTEM = (
    "You edit code by answering with SEARCH/REPLACE blocks. Each block starts with the file's path on its own line, "
    "then a fenced block holding `<<<<<<< SEARCH`, the exact existing lines to find, `=======`, the lines to put "
    "there instead, and `>>>>>>> REPLACE`. Quote the existing lines character for character, with just enough "
    "context to be unique. Never reply with the whole file.")


def blocks(rel: str, before: str, after: str) -> list[str]:
    """SEARCH/REPLACE blocks turning `before` into `after`: each changed run of lines with one line of context."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    out = []
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(1):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"{rel}\n```python\n<<<<<<< SEARCH\n{''.join(a[i1:i2])}=======\n{''.join(b[j1:j2])}"
                   ">>>>>>> REPLACE\n```")
    return out


def search_replace(rel: str, rng: random.Random) -> dict | None:
    src = read_stdlib(rel)
    done = edits(src, rng, rng.choice([1, 2, 2]))
    if not done:
        return None
    found = blocks(rel, src, done[-1].text)
    said = joined([e.summary for e in done])
    intro = f"{said[0].upper()}{said[1:]}; {len(found)} block{'s' if len(found) > 1 else ''}:"
    messages = [{"role": "system", "content": SEARCH_REPLACE_SYSTEM},
                {"role": "user", "content": f"This is `{rel}`:\n\n{fenced(src)}\n\n{requests(done)}."},
                {"role": "assistant", "content": intro + "\n\n" + "\n\n".join(found)}]
    return {"kind": "search_replace", "source": source_name(rel), "messages": messages}


# ---- tool_loop ---------------------------------------------------------------------------------------------

AGENT_SYSTEM = (
    "You are a coding agent working in a checkout of the Python standard library (Lib/). Tools:\n"
    "- list_files(path): the files in a directory, as JSON\n"
    "- grep(pattern, path): lines containing the literal text `pattern` under `path`, as JSON\n"
    "- read_file(path, start_line, end_line): those lines of a file\n"
    "Look things up before answering, and quote the code you rely on.")
MAX_MATCHES = 20


class Calls:
    """Tool-call ids for one conversation: call_1, call_2, …"""

    def __init__(self):
        self.n = 0

    def call(self, name: str, arguments: dict) -> dict:
        self.n += 1
        return {"id": f"call_{self.n}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}


def package_files(package: str) -> list[str]:
    return [p.relative_to(STDLIB).as_posix() for p in sorted((STDLIB / package).rglob("*.py"))
            if not SKIPPED_DIRS & set(p.relative_to(STDLIB).parts[:-1])]


def list_files(package: str) -> str:
    entries = [{"name": p.name, "type": "dir" if p.is_dir() else "file",
                **({"bytes": p.stat().st_size} if p.is_file() else {})}
               for p in sorted((STDLIB / package).iterdir()) if p.name != "__pycache__"]
    return json.dumps({"path": package, "entries": entries}, indent=2)


def grep(pattern: str, package: str) -> str:
    matches = [{"path": rel, "line": i, "text": line.strip()}
               for rel in package_files(package)
               for i, line in enumerate(read_stdlib(rel).splitlines(), start=1) if pattern in line]
    return json.dumps({"pattern": pattern, "path": package, "matches": matches[:MAX_MATCHES],
                       "truncated": len(matches) > MAX_MATCHES}, indent=2)


def read_lines(rel: str, start: int, end: int) -> str:
    return "\n".join(read_stdlib(rel).splitlines()[start - 1:end]) + "\n"


@dataclass(frozen=True)
class Function:
    rel: str
    node: ast.FunctionDef

    @property
    def start(self) -> int:
        return min([self.node.lineno, *(d.lineno for d in self.node.decorator_list)])


def documented_functions(package: str) -> list[Function]:
    """Functions of `package` with a docstring, defined once in it (so `grep "def NAME("` finds one)."""
    found = [Function(rel, f) for rel in package_files(package) for f in defined_functions(ast.parse(read_stdlib(rel)))
             if ast.get_docstring(f) and f.end_lineno - f.lineno >= 4]
    names = [f.node.name for f in found]
    return [f for f in found if names.count(f.node.name) == 1 and not f.node.name.startswith("__")]


def signature(fn: Function) -> str:
    lines = read_stdlib(fn.rel).splitlines()
    return "\n".join(lines[fn.node.lineno - 1:fn.node.body[0].lineno - 1]).rstrip() \
        if fn.node.body[0].lineno > fn.node.lineno else lines[fn.node.lineno - 1]


def describe_arguments(fn: Function) -> str:
    names = [a.arg for a in [*fn.node.args.posonlyargs, *fn.node.args.args, *fn.node.args.kwonlyargs]
             if a.arg not in ("self", "cls")]
    if not names:
        return "It takes no arguments of its own."
    return f"It takes {len(names)} argument{'s' if len(names) > 1 else ''}: {joined([f'`{n}`' for n in names])}."


def definition_answer(fn: Function, package: str) -> str:
    doc = paragraphs(ast.get_docstring(fn.node))[0]
    quoted = "\n".join("> " + line for line in doc.splitlines())
    return (f"`{fn.node.name}` is defined in `{fn.rel}` at line {fn.node.lineno}:\n\n{fenced(signature(fn))}\n\n"
            f"Its docstring says:\n\n{quoted}\n\n{describe_arguments(fn)} "
            f"The definition runs to line {fn.node.end_lineno} of the file.")


def callers_answer(fn: Function, result: str) -> str:
    matches = [m for m in json.loads(result)["matches"] if not m["text"].startswith(("def ", "async def "))]
    if not matches:
        return f"Nothing else in the package calls `{fn.node.name}(` directly; it is only defined there."
    lines = [f"- `{m['path']}` line {m['line']}: `{m['text']}`" for m in matches]
    plural = "s" if len(matches) > 1 else ""
    return f"`{fn.node.name}` is called in {len(matches)} place{plural}:\n\n" + "\n".join(lines)


def tool_turn(messages: list, calls: list[dict], results: list[str]) -> None:
    messages.append({"role": "assistant", "content": None, "tool_calls": calls})
    messages += [{"role": "tool", "tool_call_id": c["id"], "content": r} for c, r in zip(calls, results)]


QUESTIONS = ("Where is `{name}` defined in `{package}`, and what does it do?",
             "I need to understand `{name}` in the `{package}` package. Find it and explain it.",
             "Can you look up `{name}` in `{package}` and tell me what it is for?",
             "What does `{name}` do? It is somewhere under `{package}`.")


def tool_loop(package: str, fn: Function, rng: random.Random) -> dict:
    name, calls, messages = fn.node.name, Calls(), [{"role": "system", "content": AGENT_SYSTEM}]
    messages.append({"role": "user", "content": rng.choice(QUESTIONS).format(name=name, package=package)})
    listing, found = calls.call("list_files", {"path": package}), calls.call("grep", {"pattern": f"def {name}(",
                                                                                      "path": package})
    if rng.random() < 0.5:  # both at once, or one after the other
        tool_turn(messages, [listing, found], [list_files(package), grep(f"def {name}(", package)])
    else:
        tool_turn(messages, [listing], [list_files(package)])
        tool_turn(messages, [found], [grep(f"def {name}(", package)])
    end = min(fn.node.end_lineno, fn.start + 40)
    tool_turn(messages, [calls.call("read_file", {"path": fn.rel, "start_line": fn.start, "end_line": end})],
              [read_lines(fn.rel, fn.start, end)])
    messages.append({"role": "assistant", "content": definition_answer(fn, package)})
    if rng.random() < 0.5:
        messages.append({"role": "user", "content": f"Where is `{name}` called from within `{package}`?"})
        result = grep(f"{name}(", package)
        tool_turn(messages, [calls.call("grep", {"pattern": f"{name}(", "path": package})], [result])
        messages.append({"role": "assistant", "content": callers_answer(fn, result)})
    return {"kind": "tool_loop", "source": source_name(fn.rel), "messages": messages}


def tool_loops(rng: random.Random) -> list[dict]:
    out = []
    for package in rng.sample(TOOL_PACKAGES, SESSIONS):
        for fn in rng.sample(documented_functions(package), PER_SESSION):
            out.append(tool_loop(package, fn, rng))
    return out


# ---- quote -------------------------------------------------------------------------------------------------

PLAIN_TOPICS = ("assert", "assignment", "async", "augassign", "binary", "booleans", "break", "calls", "class",
                "comparisons", "continue", "del", "dict", "for", "function", "global", "if", "import", "lambda",
                "lists", "nonlocal", "pass", "power", "raise", "return", "slicings", "subscriptions", "try", "while",
                "with", "yield", "in", "shifting", "bitwise", "exprlists", "attribute-references")
NOT_QUOTED = {"compound", "specialnames", "else"}  # they repeat other topics' text
STOPWORDS = {"which", "their", "there", "these", "those", "would", "should", "other", "about", "where", "being",
             "after", "before", "under", "while", "since", "using", "unless", "within", "without", "through"}


@dataclass(frozen=True)
class Document:
    title: str
    text: str
    source: str
    code_indented: bool = False  # an indented paragraph is code or grammar (the reference), not prose


def topic_documents() -> list[Document]:
    """The language reference's topics not asked about in `plain`, each in at most two pieces of ~5000 characters."""
    topics, docs = reference_topics(), []
    for key in sorted(set(topics) - set(PLAIN_TOPICS) - NOT_QUOTED):
        for i, piece in enumerate(chunks(topics[key], 5000)[:2]):
            docs.append(Document(f"the Python reference, “{topics[key].splitlines()[0]}”", piece,
                                 f"{source_name('pydoc_data/topics.py')}#{key}" + (f" part {i + 1}" if i else ""),
                                 code_indented=True))
    return [d for d in docs if len(d.text) >= MIN_DOCUMENT]


def licence_documents() -> list[Document]:
    """Python's LICENSE.txt and the permissive licence texts, in pieces of ~5000 characters."""
    docs = [Document("Python's LICENSE file", piece, f"{source_name('LICENSE.txt')} part {i + 1}")
            for i, piece in enumerate(chunks(read_stdlib("LICENSE.txt"), 5000))]
    for name in LICENSE_FILES:
        docs += [Document(f"the {name} licence", piece, f"{LICENSES / name} part {i + 1}")
                 for i, piece in enumerate(chunks((LICENSES / name).read_text(encoding="utf-8"), 5000))]
    return [d for d in docs if len(d.text) >= MIN_DOCUMENT]


def prose_sentences(doc: Document) -> list[tuple[int, str]]:
    """(paragraph number, sentence) for the sentences of the document's prose paragraphs, each unwrapped onto
    one line."""
    out = []
    for number, p in enumerate(paragraphs(doc.text), start=1):
        if doc.code_indented and p.startswith((" ", "\t")) or set(p.strip()) <= set("*=-"):
            continue
        flat = " ".join(p.split())
        out += [(number, s) for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"“(])", flat) if len(s) > 20]
    return out


def keywords(sentences: list[tuple[int, str]]) -> list[str]:
    """Words (6+ letters, not stopwords) that occur in two to four of the sentences."""
    seen: dict[str, int] = {}
    for _, s in sentences:
        for w in {w.lower() for w in re.findall(r"[A-Za-z]{6,}", s)} - STOPWORDS:
            seen[w] = seen.get(w, 0) + 1
    return sorted(w for w, n in seen.items() if 2 <= n <= 4)


COMMENTS = ("That is in paragraph {p}.", "(paragraph {p})", "This one comes from paragraph {p}.",
            "Paragraph {p} says this.", "Found in paragraph {p}.")


def quote_reply(word: str, sentences: list[tuple[int, str]], rng: random.Random) -> str:
    hits = [(p, s) for p, s in sentences if re.search(rf"\b{word}\b", s, re.IGNORECASE)] or \
        [(p, s) for p, s in sentences if word in s.lower()]
    items = [f"> {s}\n\n{rng.choice(COMMENTS).format(p=p)}" for p, s in hits]
    return f"{len(hits)} sentence{'s' if len(hits) > 1 else ''} mention “{word}”:\n\n" + "\n\n".join(items)


def quote(doc: Document, rng: random.Random) -> dict | None:
    sentences = prose_sentences(doc)
    words = keywords(sentences)
    if len(words) < 2:
        return None
    first, second = rng.sample(words, 2)
    messages = [{"role": "user", "content": f"This is from {doc.title}:\n\n---\n{doc.text}\n---\n\n"
                                            f"Quote, word for word, every sentence that mentions “{first}”."},
                {"role": "assistant", "content": quote_reply(first, sentences, rng)}]
    if rng.random() < 0.5:
        messages += [{"role": "user", "content": f"And the ones that mention “{second}”?"},
                     {"role": "assistant", "content": quote_reply(second, sentences, rng)}]
    return {"kind": "quote", "source": doc.source, "messages": messages}


def quotes(rng: random.Random) -> list[dict]:
    """A conversation about every licence document, then reference topics up to the count."""
    licences = first_n(quote, licence_documents(), len(licence_documents()), rng)
    return [*licences, *first_n(quote, topic_documents(), COUNTS["quote"] - len(licences), rng)]


# ---- plain -------------------------------------------------------------------------------------------------

SNIPPET_NODES = {"assert": ast.Assert, "augassign": ast.AugAssign, "break": ast.Break, "class": ast.ClassDef,
                 "continue": ast.Continue, "del": ast.Delete, "dict": ast.Dict, "for": ast.For, "global": ast.Global,
                 "import": ast.ImportFrom, "lambda": ast.Lambda, "nonlocal": ast.Nonlocal, "raise": ast.Raise,
                 "return": ast.Return, "slicings": ast.Slice, "try": ast.Try, "while": ast.While, "with": ast.With,
                 "yield": ast.Yield, "async": ast.AsyncFunctionDef}
ASKS = ("Can you explain {title} in Python? Keep it reasonably short.",
        "How does Python handle this: {title}? I'd like the precise rules.",
        "I keep getting confused by {title}. What are the rules?",
        "Explain {title}, please.")


def snippet(node_type, rng: random.Random, files: list[str]) -> tuple[str, str] | None:
    """(file, up to 12 lines around a `node_type` node) from the first of `files` (shuffled) that has one."""
    for rel in rng.sample(files, len(files)):
        src = read_stdlib(rel)
        nodes = [n for n in ast.walk(ast.parse(src)) if isinstance(n, node_type) and hasattr(n, "lineno")]
        if nodes:
            n = rng.choice(nodes)
            lines = src.splitlines()[n.lineno - 1:n.lineno + 11]
            return rel, "\n".join(lines)
    return None


def shared_run(answer: str, prompt: str) -> str | None:
    """The first run of NO_COPY characters of `answer` that `prompt` holds too, if any."""
    runs = {prompt[i:i + NO_COPY] for i in range(len(prompt) - NO_COPY + 1)}
    return next((answer[i:i + NO_COPY] for i in range(len(answer) - NO_COPY + 1) if answer[i:i + NO_COPY] in runs),
                None)


def plain_turn(key: str, rng: random.Random, files: list[str]) -> tuple[str, str, str]:
    """(question, answer, source) about reference topic `key`; the answer is the topic's text, which the
    question does not show."""
    topic = reference_topics()[key]
    title = topic.splitlines()[0].replace('"', "`")
    title = title[0].lower() + title[1:] if not title.startswith("The ") else "t" + title[1:]
    ask = rng.choice(ASKS).format(title=title)
    source = f"{source_name('pydoc_data/topics.py')}#{key}"
    shown = snippet(SNIPPET_NODES[key], rng, files) if key in SNIPPET_NODES else None
    if shown is not None:
        ask = f"I came across this in `{shown[0]}`:\n\n{fenced(shown[1])}\n\n{ask}"
        source += f" + {source_name(shown[0])}"
    return ask, chunks(without_heading(topic), 4000)[0], source


def plain(key: str, rng: random.Random, files: list[str]) -> dict:
    ask, answer, source = plain_turn(key, rng, files)
    messages = [{"role": "system", "content": "You are a helpful assistant who knows Python well."},
                {"role": "user", "content": ask}]
    if (run := shared_run(answer, "\n".join(m["content"] for m in messages))) is not None:
        raise SystemExit(f"the plain answer from {source} repeats its prompt ({run!r}); choose other topics")
    messages.append({"role": "assistant", "content": answer})
    return {"kind": "plain", "source": source, "messages": messages}


# ---- the file ----------------------------------------------------------------------------------------------

def first_n(make, candidates: list, n: int, rng: random.Random) -> list[dict]:
    """The conversations `make` builds from shuffled `candidates` until there are `n` (None: skipped)."""
    out = []
    for c in rng.sample(candidates, len(candidates)):
        if len(out) == n:
            break
        conversation = make(c, rng)
        if conversation is not None:
            out.append(conversation)
    if len(out) < n:
        raise SystemExit(f"only {len(out)} {make.__name__} conversations could be made, {n} wanted")
    return out


def interleaved(groups: list[list[dict]], rng: random.Random) -> list[dict]:
    """All conversations in a random order that keeps each group's own order (a server sees them mixed)."""
    queues, out = [list(g) for g in groups], []
    while any(queues):
        weights = [len(q) for q in queues]
        out.append(queues[rng.choices(range(len(queues)), weights)[0]].pop(0))
    return out


def transcripts() -> str:
    rng = random.Random(SEED)
    small = stdlib_modules(1500, 4500, TOOL_PACKAGES)
    medium = stdlib_modules(4500, 10000, TOOL_PACKAGES)
    groups = [first_n(rewrite, small, COUNTS["rewrite"], rng),
              first_n(search_replace, medium, COUNTS["search_replace"], rng),
              tool_loops(rng),
              quotes(rng),
              [plain(key, rng, medium) for key in rng.sample(PLAIN_TOPICS, COUNTS["plain"])]]
    return "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in interleaved(groups, rng))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    args = parser.parse_args(argv)
    text = transcripts()
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print(f"{OUT}: {'identical' if same else 'DIFFERS from a fresh generation'}")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"{OUT}: {text.count(chr(10))} conversations, {len(text.encode())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
