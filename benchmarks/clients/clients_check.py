"""Real client libraries, unchanged, asking the demo model for a person through a live `k3 serve`: issue 42's target
is that each returns a valid, closed reply in N of N tries at temperature 1. Never part of `make test`.

Each library comes from PyPI, latest, into a venv of its own under .venv-clients/ (built here on first use: their
pins disagree — instructor's jiter<0.15 holds openai at 3.3 where the others take the newest — and torch is never
among them; delete a venv to take a newer release). Per try, with at most --max-tokens ids a request:
  llm                   `llm -m k3-demo --schema 'name, age int' -o temperature 1 -o max_tokens 200 'Invent a person.'`
                        (an OpenAI-compatible model in extra-openai-models.yaml, as tests/serve/test_llm_cli.py sets
                        it up): exit 0, stdout JSON with a string name and an integer age
  instructor            from_openai(OpenAI(base_url=…)), default mode (TOOLS), response_model=Person: a Person
  openai-parse          the openai SDK's chat.completions.parse(response_format=Person): a parsed Person
  openai-tool-required  tools=[record_person(name, age)], tool_choice "required"   } finish_reason tool_calls, every
  openai-tool-named     the same, tool_choice naming record_person                 } call's arguments valid (jsonschema)
  pydantic-ai           Agent(OpenAIChatModel, output_type=Person): a Person
  langchain             ChatOpenAI(base_url=…).with_structured_output(Person): a Person
  kimi                  Moonshot's agent CLI, `kimi --print --final-message-only -p 'say hi'` with k3 serve as its
                        provider (type "kimi", a config file and KIMI_SHARE_DIR in a temporary directory;
                        KIMI_MODEL_TEMPERATURE 1, KIMI_MODEL_MAX_TOKENS --max-tokens): exit 0 and a reply. Its whole
                        agent prompt and tool list go with every request (~29,000 ids of the demo's tokenizer), the
                        time of day in it, so each try forwards its tail again: 3 tries. kimi-cli 1.51.0, the last
                        release that runs — 1.52.0, the archived package's final release, only prints that the CLI
                        moved to Kimi Code (not on PyPI) —, needs Python >= 3.12: its venv is made with
                        --kimi-python, or the first of python3.12 … python3.14 on PATH that runs.
(one_try.py holds the library calls; Person is {name: str, age: int}.) Every try must also end on a closed reply:
the last the server sent must not say finish_reason "length". The clients talk to recorder.py, a proxy that passes
every byte through and keeps each exchange, so a try's reply length (completion_tokens, from usage) and raw text are
known whatever the library shows. A try is killed after --try-seconds (kimi's after 15 minutes at least).
Prints the memory plan, a line per try and per client ("k of N valid", the first failure quoted); --json keeps every
try with its requests and replies.
Exits 0 only when every try of every client is valid.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import jsonschema

from one_try import PERSON, PROMPT, TOOL
from recorder import Recorder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from live_server import LiveServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

VENVS = {  # venv: (what pip installs in it, the distributions whose versions are reported)
    "llm": (["llm"], ["llm", "openai"]),
    "instructor": (["instructor"], ["instructor", "openai"]),
    "openai": (["openai"], ["openai"]),
    "pydantic-ai": (["pydantic-ai-slim[openai]"], ["pydantic-ai-slim", "openai"]),
    "langchain": (["langchain-openai"], ["langchain-openai", "langchain-core", "openai"]),
    "kimi": (["kimi-cli==1.51.0"], ["kimi-cli"]),
}
NEEDS_PYTHON = {"kimi": (3, 12)}  # venv: the oldest Python its packages install on (else this one's)
CLIENTS = {"llm": "llm", "instructor": "instructor", "openai-parse": "openai", "openai-tool-required": "openai",
           "openai-tool-named": "openai", "pydantic-ai": "pydantic-ai", "langchain": "langchain",
           "kimi": "kimi"}  # client: venv
KIMI_PROMPT = "say hi"
# kimi's prompt holds the time of day ~9 kB in, so every try forwards the part after it again: fewer, longer tries
TRIES = {"kimi": 3}             # client: its tries, at most (--tries for the others)
TRY_SECONDS = {"kimi": 900}     # client: a try's limit, at least (--try-seconds for the others)


def interpreter(name: str, given: str | None) -> str:
    """The Python to make venv `name` with: `given`, else this one, else the first python3.N on PATH new enough for
    it (one that runs: a pyenv shim for a version not selected does not)."""
    need = NEEDS_PYTHON.get(name)
    if need is None:
        return sys.executable
    candidates = [given] if given else [sys.executable] + [f"python3.{minor}" for minor in range(need[1], 15)]
    probe = f"import sys, venv; sys.exit(sys.version_info[:2] < {need})"
    for candidate in candidates:
        found = shutil.which(candidate)
        if found and subprocess.run([found, "-c", probe], capture_output=True).returncode == 0:
            return found
    where = f"--kimi-python {given} is not" if given else f"neither this Python nor python3.{need[1]} … python3.14 is"
    sys.exit(f"clients-check: {' '.join(VENVS[name][0])} needs Python >= {need[0]}.{need[1]}, and {where} one that "
             f"runs; name one with --kimi-python PATH, or leave {name} out: --clients "
             + ",".join(c for c, v in CLIENTS.items() if v != name))


def ensure_venv(venvs: Path, name: str, python: str | None = None) -> tuple[Path, str]:
    """The venv's bin directory, built when missing or made from other requirements (or, where a Python is named
    for it, by another Python); and its versions."""
    packages, dists = VENVS[name]
    venv = venvs / name
    stamp = venv / ".k3-clients-installed"
    python = interpreter(name, python)
    wanted = " ".join(packages) + (f" with {python}" if name in NEEDS_PYTHON else "")
    if not stamp.exists() or stamp.read_text() != wanted:
        print(f"clients-check: building {venv.relative_to(ROOT)}: pip install {' '.join(packages)}", flush=True)
        subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
        pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *packages],
                             capture_output=True, text=True)
        if pip.returncode != 0:
            sys.exit(f"clients-check: pip install {' '.join(packages)} exited {pip.returncode}:\n{pip.stderr[-4000:]}")
        stamp.write_text(wanted)
    versions = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m, sys; "
                               "print(' '.join(d + ' ' + m.version(d) for d in sys.argv[1:]))", *dists],
                              capture_output=True, text=True, check=True).stdout.strip()
    return venv / "bin", versions


def llm_home(work: Path, url: str, model: str) -> Path:
    """LLM_USER_PATH with one OpenAI-compatible model, k3-demo (JSON is YAML: no yaml needed here)."""
    home = work / "llm-home"
    home.mkdir(exist_ok=True)
    entry = {"model_id": "k3-demo", "model_name": model, "api_base": url + "/v1", "supports_schema": True}
    (home / "extra-openai-models.yaml").write_text(json.dumps([entry]))
    return home


def kimi_config(work: Path, url: str, model: str) -> Path:
    """kimi's config: k3 serve as a provider of type "kimi" (an OpenAI-compatible /v1), its model the default."""
    config = work / "kimi-config.toml"
    config.write_text(f'default_model = "k3"\n\n[providers.k3]\ntype = "kimi"\nbase_url = "{url}/v1"\n'
                      f'api_key = "k3-local"\n\n[models.k3]\nprovider = "k3"\nmodel = "{model}"\n'
                      'max_context_size = 131072\n')
    return config


def command(client: str, bin_dir: Path, url: str, model: str, max_tokens: int, work: Path) -> list[str]:
    if client == "kimi":
        return [str(bin_dir / "kimi"), "--config-file", str(kimi_config(work, url, model)), "-w", str(work),
                "--print", "--final-message-only", "-p", KIMI_PROMPT]
    if client == "llm":
        return [str(bin_dir / "llm"), "-m", "k3-demo", "--schema", "name, age int", "-o", "temperature", "1",
                "-o", "max_tokens", str(max_tokens), PROMPT]
    return [str(bin_dir / "python"), str(HERE / "one_try.py"), client, url + "/v1", model, str(max_tokens)]


def shorter(line: str, limit: int = 160) -> str:
    return line if len(line) <= limit else line[:limit] + "…"


def run_try(cmd: list[str], env: dict, seconds: float) -> dict:
    """The client's process, killed after `seconds`: its exit, output and time."""
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return {"exit": None, "stdout": "", "stderr": "", "seconds": seconds, "error": f"killed after {seconds:g} s"}
    out = {"exit": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-4000:],
           "seconds": round(time.perf_counter() - started, 2), "error": None}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        out["error"] = f"exit {done.returncode}: {shorter(last)}"
    return out


def returned(client: str, stdout: str):
    """What the client gave back: kimi's final message, llm's stdout parsed as JSON, else one_try.py's {"value"} or
    {"error"}."""
    if client == "kimi":
        return stdout.strip(), None
    if client == "llm":
        try:
            return json.loads(stdout), None
        except ValueError:
            return None, f"stdout is not JSON ({len(stdout)} characters)"
    try:
        line = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"one_try.py printed no JSON line: {stdout[-120:]!r}"
    return line.get("value"), line.get("error") and shorter(line["error"])


def invalid_value(client: str, value) -> str | None:
    """Why the value is not what the client was asked for, or None."""
    if client == "kimi":
        return None if value else "no final message on stdout"
    try:
        if not client.startswith("openai-tool"):
            jsonschema.validate(value, PERSON)
            return None
        if value["finish_reason"] != "tool_calls" or not value["tool_calls"]:
            return f"finish_reason {value['finish_reason']!r} with {len(value['tool_calls'])} tool calls"
        for call in value["tool_calls"]:
            if call["name"] != TOOL["function"]["name"]:
                return f"a call of {call['name']!r}"
            jsonschema.validate(json.loads(call["arguments"]), PERSON)
    except (ValueError, jsonschema.ValidationError) as e:
        return f"{type(e).__name__}: {shorter((str(e).splitlines() or [''])[0])}"
    return None


def judge(client: str, outcome: dict, chats: list) -> str | None:
    """None when the try is valid, else the failure: the client's error or the value's fault, then the last reply."""
    failure = outcome["error"]
    if failure is None:
        value, failure = returned(client, outcome["stdout"])
        outcome["value"] = value
        failure = failure or invalid_value(client, value)
    if failure is None and not chats:
        failure = "no chat completion reached the server"
    if failure is None and chats[-1].summary.get("finish_reason") == "length":
        failure = "the last reply was cut at max_tokens (finish_reason length)"
    if failure and chats:
        s = chats[-1].summary
        reply = (f"HTTP {chats[-1].status}: {s['error']}" if "error" in s else
                 f"(finish_reason {s.get('finish_reason')}) {s.get('text', '')[:120]!r}")
        failure += f"; last reply {reply}"
    return failure


def exchange_record(ex) -> dict:
    try:
        request = json.loads(ex.request)
    except ValueError:
        request = ex.request.decode(errors="replace")
    return {"method": ex.method, "path": ex.path, "status": ex.status, "request": request,
            "reply": ex.reply.decode(errors="replace"), **ex.summary}


def tokens(chats: list) -> str:
    """completion_tokens of each reply in the try, `+` between retries; the status of a refusal."""
    parts = [str(ex.summary.get("completion_tokens")) if ex.status == 200 else f"HTTP{ex.status}" for ex in chats]
    return "+".join(parts) or "-"


def check_client(client: str, cmd: list[str], recorder: Recorder, env: dict, args) -> list[dict]:
    print(f"\n{client}\n  $ {shlex.join(cmd)}", flush=True)
    rows = []
    for i in range(1, min(args.tries, TRIES.get(client, args.tries)) + 1):
        recorder.label = f"{client} {i}"
        outcome = run_try(cmd, env, max(args.try_seconds, TRY_SECONDS.get(client, 0)))
        exchanges = recorder.labelled(recorder.label)
        for ex in exchanges:
            ex.done.wait(30)
        chats = [ex for ex in exchanges if ex.path.endswith("/chat/completions")]
        failure = judge(client, outcome, chats)
        rows.append({"try": i, "valid": failure is None, "failure": failure, "tokens": tokens(chats), **outcome,
                     "exchanges": [exchange_record(ex) for ex in exchanges]})
        print(f"  try {i}: {'valid' if failure is None else 'INVALID'}, {tokens(chats)} tokens, "
              f"{outcome['seconds']} s" + (f": {failure}" if failure else ""), flush=True)
    return rows


def summary_line(client: str, versions: str, rows: list[dict]) -> str:
    valid = sum(r["valid"] for r in rows)
    first = next((r for r in rows if not r["valid"]), None)
    line = (f"{client} ({versions}): {valid} of {len(rows)} valid; reply tokens per try "
            f"{' '.join(r['tokens'] for r in rows)}")
    return line + (f"; first failure (try {first['try']}): {first['failure']}" if first else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tries", type=int, default=10, help="tries of each client (default 10)")
    p.add_argument("--try-seconds", type=float, default=120, help="a try's wall-time limit (default 120)")
    p.add_argument("--max-tokens", type=int, default=200, help="max_tokens of every request (default 200)")
    p.add_argument("--clients", default=",".join(CLIENTS), help=f"a comma-separated subset of {', '.join(CLIENTS)}")
    p.add_argument("--venvs", default=str(ROOT / ".venv-clients"), help="where each library's venv is built")
    p.add_argument("--kimi-python", metavar="PATH", help="a Python >= 3.12 to build kimi's venv with (default: this "
                   "one if new enough, else the first python3.12 … python3.14 on PATH that runs)")
    p.add_argument("--json", default=str(ROOT / "build" / "clients-check.json"), help="every try, written here")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as Ctrl-C does: through `finally`, the server stopped
    clients = args.clients.split(",")
    unknown = set(clients) - set(CLIENTS)
    if unknown:
        p.error(f"unknown clients {sorted(unknown)}; known: {', '.join(CLIENTS)}")
    bins = {name: ensure_venv(Path(args.venvs), name, args.kimi_python if name == "kimi" else None)
            for name in dict.fromkeys(CLIENTS[c] for c in clients)}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = LiveServer(["--prompt-cache", str(Path(tmp) / "prompt-cache")], Path(tmp) / "serve.log",
                            "clients-check")
        recorder = None
        try:
            model = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
            print(f"\n$ {shlex.join(server.cmd)}\n{server.plan()}", flush=True)
            recorder = Recorder(server.url)
            env = {**os.environ, "LLM_USER_PATH": str(llm_home(Path(tmp), recorder.url, model)),
                   "KIMI_SHARE_DIR": str(Path(tmp) / "kimi-share"), "KIMI_MODEL_TEMPERATURE": "1",
                   "KIMI_MODEL_MAX_TOKENS": str(args.max_tokens)}
            env.pop("OPENAI_API_KEY", None)
            for client in clients:
                bin_dir, versions = bins[CLIENTS[client]]
                cmd = command(client, bin_dir, recorder.url, model, args.max_tokens, Path(tmp))
                results[client] = {"versions": versions, "command": cmd,
                                   "tries": check_client(client, cmd, recorder, env, args)}
        finally:
            if recorder:
                recorder.close()
            server.stop()
    print(f"\nclients-check: {args.tries} tries each (kimi {TRIES['kimi']}) at temperature 1, max_tokens "
          f"{args.max_tokens}")
    for client, result in results.items():
        print("  " + summary_line(client, result["versions"], result["tries"]))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"server": server.cmd, "tries": args.tries, "max_tokens": args.max_tokens,
                                           "clients": results}, indent=1))
    short = [c for c, r in results.items() if not all(t["valid"] for t in r["tries"])]
    print("clients-check: " + (f"FAILED: {', '.join(short)} had an invalid try" if short
                               else "every try of every client valid") + f"; every try in {args.json}")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
