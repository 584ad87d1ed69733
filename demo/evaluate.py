"""Evaluate the demo model with the k3 engine itself (no torch): greedy chat, one fresh ChatSession per
question, accuracy per category (exact = the whole reply; contains = the key fact is in it).

    .venv/bin/python demo/evaluate.py [MODEL_DIR] [--seed 0] [--limit N] [--write-provenance] [--show-failures 5]

MODEL_DIR defaults to wizard/data/demo-model. The questions come from demo/corpus.py with the seed the
model was trained with: in-distribution (a fixed sample of the trained phrasings), held-out
(country, phrasing) pairs, capital questions in templates never trained on, unseen number pairs,
out-of-domain questions with unseen fillers and templates, greetings and identity, and a few questions
in thinking mode. Then the structured part (corpus_structured.py), sampled at temperature 1 (seeds 0..N-1) as a
client would: a reply held to a person schema for requests and names never trained on, a forced call of a person
tool never trained on (named, or "required" among the other tools declared), each *valid* when it closed and its
name is a non-empty string and its age an integer (*exact*: the person named in the request, where one was);
and, greedy, whether the model calls get_weather for the weather and answers a capital itself with tools
declared. --write-provenance stores the table in the model's k3-demo-model.json (and
refreshes SHA256SUMS).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
import corpus_structured  # noqa: E402

from k3core import (ChatSession, Conversation, EngineConfig, SamplingParams, Session, chat_grammar,  # noqa: E402
                    load_tokenizer, open_engine)
from k3core.text.chat import build_ids, forced_tool_prefix, parse_tool_calls, render, split_reply  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "wizard" / "data" / "demo-model"
HEADLINE = "What is the capital of France?"


def categories(data: dict, limit: int | None) -> dict[str, list[dict]]:
    cats: dict[str, list[dict]] = {}
    for c in data["eval_train"]:
        cats.setdefault(f"in-distribution/{c['category']}", []).append(c)
    cats["held-out (country, phrasing) pairs"] = data["heldout_capital"]
    cats["held-out: capital phrasings never trained"] = data["new_phrasing"]
    cats["held-out: unseen number pairs"] = data["heldout_arith"]
    cats["out-of-domain (unseen) -> I don't know"] = data["ood_eval"]
    for c in data["small_talk"]:
        cats.setdefault(f"small talk/{c['category']}", []).append(c)
    thinking = [c for c in data["eval_train"] if c["category"] in ("capital", "arith")][:30]
    cats["thinking mode (capital, arithmetic)"] = [{**c, "mode": "thinking"} for c in thinking]
    if limit:
        cats = {k: v[:limit] for k, v in cats.items()}
    return cats


def ask(engine, tok, question: str, mode: str = "instruct", max_tokens: int = 40) -> tuple[str, bool]:
    chat = ChatSession(engine, tok, mode=mode)
    for _ in chat.ask(question, SamplingParams(max_tokens=max_tokens)):
        pass
    return chat.last["answer"], chat.last["reason"] == "stop id"


def person_ok(value) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("name"), str) and value["name"].strip() != ""
            and type(value.get("age")) is int)


def json_reply(engine, tok, conv: dict, seed: int) -> tuple[dict | None, str]:
    """(the person, the reply's text) of a reply held to a person schema (one of the shapes clients send, by seed);
    the person is None unless the reply closed and holds a valid one."""
    chat = Conversation(tok, "instruct")
    chat.add_user(conv["messages"][0]["content"])
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=80,
                            json_schema=corpus_structured.person_schema(seed % 4))
    done = list(Session(engine, tok).generate(chat.prompt(), params, stop_ids=chat.stop_ids, channel="response"))[-1]
    text = split_reply(done.ids, tok).content
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None, text
    return (value if done.reason == "stop id" and person_ok(value) else None), text


def tool_reply(engine, tok, conv: dict, seed: int) -> tuple[dict | None, str]:
    """(the person, the reply's text) of a forced call: the person tool named (even seeds), or "required" among every
    tool the conversation declares (odd seeds); the person is None unless one closed call of the person tool holds
    a valid one."""
    tools, person_tool = conv["tools"], conv["key"]
    named = person_tool if seed % 2 == 0 else None
    forced = build_ids(tok, forced_tool_prefix("instruct", named))
    prompt = render(conv["messages"][:1], tok, "instruct", tools=tools) + forced
    grammar = chat_grammar(tok, "response", tools=tools, tool_choice=named or "required")
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=100)
    done = list(Session(engine, tok).generate(prompt, params, stop_ids=grammar.stop_ids, channel=None,
                                              grammar=grammar))[-1]
    text = tok.decode(forced + done.ids)
    calls = parse_tool_calls(text)
    valid = (done.reason == "stop id" and len(calls) == 1 and calls[0].complete and calls[0].name == person_tool
             and person_ok(calls[0].arguments))
    return (calls[0].arguments if valid else None), text


def auto_tools(engine, tok) -> dict:
    """Greedy, tools declared (get_weather, add, search_web) and none forced: the weather asked for is a call
    to get_weather for that city; a capital asked for is answered in text."""
    tools = [corpus_structured.WEATHER_TOOL, corpus_structured.ADD_TOOL, corpus_structured.SEARCH_TOOL]
    out = {}
    weather = [(f"What is the weather in {c}?", c) for c in corpus_structured.CITIES[:10]]
    capitals = [(f"What is the capital of {c}?", capital) for c, capital in corpus.CAPITALS[:10]]
    for label, questions in (("weather -> get_weather(city)", weather), ("capital -> answered in text", capitals)):
        good = 0
        for q, want in questions:
            prompt = render([{"role": "user", "content": q}], tok, "instruct", tools=tools)
            done = list(Session(engine, tok).generate(prompt, SamplingParams(max_tokens=60),
                                                      stop_ids=[tok.id_of("<|end_of_msg|>")], channel=None))[-1]
            reply = split_reply(done.ids, tok)
            calls = [(c.name, c.arguments) for c in parse_tool_calls(reply.tools or "")]
            good += calls == [("get_weather", {"city": want})] if questions is weather else \
                (not calls and want in reply.content)
        out[label] = {"n": len(questions), "exact": round(good / len(questions), 4)}
    return out


def structured(engine, tok, data: dict, limit: int | None, show_failures: int) -> dict:
    results = {}
    for name, convs, one in (("json reply, held-out requests and names (t=1)", data["json_eval"], json_reply),
                             ("forced tool call, held-out tools (t=1)", data["tool_eval"], tool_reply)):
        convs = convs[:limit] if limit else convs
        valid = exact = extracting = 0
        failures = []
        for seed, conv in enumerate(convs):
            got, text = one(engine, tok, conv, seed)
            valid += got is not None
            question, asked = conv["messages"][0]["content"], conv.get("arguments") or json.loads(conv["expect"])
            if asked["name"] in question:  # a person to extract, not to invent
                extracting += 1
                exact += got is not None and (got["name"], got["age"]) == (asked["name"], asked.get("age"))
            if got is None and len(failures) < show_failures:
                failures.append((question, text))
        results[name] = {"n": len(convs), "valid": round(valid / len(convs), 4),
                         "exact (person named in the request)": f"{exact} of {extracting}"}
        print(f"{name:46s} {len(convs):4d} {100 * valid / len(convs):6.1f}% valid; "
              f"{exact} of {extracting} named persons exact", flush=True)
        for q, r in failures:
            print(f"      {q!r} -> {r!r}")
    for name, r in auto_tools(engine, tok).items():
        results[f"tools declared, greedy: {name}"] = r
        print(f"{'tools declared, greedy: ' + name:46s} {r['n']:4d} {100 * r['exact']:6.1f}%", flush=True)
    return results


def evaluate(model_dir: Path, seed: int, limit: int | None, show_failures: int, threads: int = 1) -> dict:
    data = corpus.build(seed)
    tok = load_tokenizer(model_dir)
    results = {}
    t0 = time.time()
    with open_engine(EngineConfig(str(model_dir), threads=threads)) as engine:
        answer, _ = ask(engine, tok, HEADLINE)
        print(f"{HEADLINE!r} -> {answer!r}")
        results["headline"] = {"question": HEADLINE, "answer": answer, "ok": "Paris" in answer}
        print(f"{'category':46s} {'n':>4s} {'exact':>7s} {'contains':>9s}")
        for name, convs in categories(data, limit).items():
            exact = contains = 0
            failures = []
            for c in convs:
                q = c["messages"][0]["content"]
                reply, finished = ask(engine, tok, q, c["mode"])
                e, k = finished and reply == c["expect"], c["key"] in reply
                exact += e
                contains += k
                if not e and len(failures) < show_failures:
                    failures.append((q, reply))
            n = len(convs)
            results[name] = {"n": n, "exact": round(exact / n, 4), "contains": round(contains / n, 4)}
            print(f"{name:46s} {n:4d} {100 * exact / n:6.1f}% {100 * contains / n:8.1f}%", flush=True)
            for q, r in failures:
                print(f"      {q!r} -> {r!r}")
        results.update(structured(engine, tok, data, limit, show_failures))
    results["seconds"] = round(time.time() - t0, 1)
    print(f"{results['seconds']} s")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--seed", type=int, default=None,
                    help="corpus seed (default: the model's, from k3-demo-model.json)")
    ap.add_argument("--limit", type=int, default=None, help="at most N questions per category")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--show-failures", type=int, default=3)
    ap.add_argument("--write-provenance", action="store_true")
    args = ap.parse_args()
    marker = args.model / "k3-demo-model.json"
    prov = json.loads(marker.read_text()) if marker.exists() else {}
    seed = args.seed if args.seed is not None else prov.get("seed", 0)
    results = evaluate(args.model, seed, args.limit, args.show_failures, args.threads)
    if args.write_provenance:
        prov["k3_engine_accuracy"] = {
            "command": "python demo/evaluate.py " + str(args.model.relative_to(ROOT) if args.model.is_absolute()
                                                        and ROOT in args.model.parents else args.model),
            **results}
        marker.write_text(json.dumps(prov, indent=1) + "\n")
        lines = [f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n"
                 for f in sorted(args.model.iterdir()) if f.is_file() and f.name != "SHA256SUMS"]
        (args.model / "SHA256SUMS").write_text("".join(lines))
        print(f"wrote {marker} and SHA256SUMS")
    if not results["headline"]["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
