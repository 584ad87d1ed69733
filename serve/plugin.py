"""Adds `k3 serve` through k3's `k3_subcommands` hook (entry point `serve = "serve.plugin"`). Parsing only:
FastAPI and uvicorn are imported when the command runs."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from k3core.cli.options import (EXIT_CODES, add_engine_arguments, add_logging_arguments, add_prompt_cache_arguments,
                                add_speculation_arguments, engine_config_from_args, prompt_cache_from_args,
                                speculation_from_args)
from k3core.report.logs import configure_logging
from k3core.plugin_api import hookimpl

from .http import KEY_ENV, KEY_GUARD, Timeouts, add_server_arguments, positive_int, timeouts_from_args


@dataclass(frozen=True)
class ServeOptions:
    """How `k3 serve` serves, beside the engine's EngineConfig."""

    host: str | None = None
    port: int = 8000
    api_key: str | None = None       # --api-key; else K3_API_KEY
    queue_size: int = 16             # requests that may wait for a place in the batch
    max_body_bytes: int = 4 << 20
    max_tokens: int = 1024           # a request that names no max_tokens gets this many at most
    access_log: bool = False
    timeouts: Timeouts = Timeouts()  # for a request's headers, then its body


def serve(config, opts: ServeOptions, speculation=lambda: None, prompt_cache=lambda engine, tokenizer: None) -> int:
    """Serve until Ctrl-C. `speculation()`: a fresh Speculation per request, or None; `prompt_cache(engine,
    tokenizer)`: the PrefixCache every request shares, or None."""
    from k3core import load_tokenizer, open_engine

    from .api import ApiOptions
    from .app import build_app
    from .http import HOW_TO_SET_A_KEY, api_key, check_host, is_loopback, listen, model_id, warn_exposed
    from .worker import EngineSlot, Worker

    key = api_key(opts.api_key)
    host = check_host(opts.host, key is not None, KEY_GUARD, HOW_TO_SET_A_KEY)  # refused before the model loads
    engine = open_engine(config, on_plan=lambda plan: print(plan.text(), file=sys.stderr))
    try:
        tokenizer = load_tokenizer(config.tokenizer or config.model)
        slot = EngineSlot(engine, tokenizer, prompt_cache(engine, tokenizer))
        worker = Worker(slot, queue_size=opts.queue_size, speculation=speculation)
        name = model_id(config.model)
        app = build_app(worker, ApiOptions(key, opts.max_body_bytes, opts.max_tokens, int(time.time())))
        if not is_loopback(host):
            warn_exposed(host)
        running = listen(app, host, opts.port, opts.access_log, opts.timeouts)
        print(f"k3 serve: model {name!r} at {running.url}/v1 ({engine.sequences} at once, {opts.queue_size} may wait"
              f"{', API key required' if key else ''}) — Ctrl-C to stop", flush=True)
        if slot.prompt_cache is not None:
            print(f"k3 serve: {slot.prompt_cache.where()}", flush=True)
        try:
            while running.thread.is_alive():
                running.thread.join(0.5)
        except KeyboardInterrupt:
            running.close()
        finally:
            worker.close()
    finally:
        engine.close()
    return 0


def cmd_serve(args) -> int:
    configure_logging(args.log_level)
    config = engine_config_from_args(args)
    speculation_from_args(args)  # a bad --draft is refused before the engine loads
    if args.bench:
        import json

        from .bench import bench_text, run_bench

        result = run_bench(config, args.bench, args.bench_tokens)
        print(json.dumps(result, indent=1) if args.json else bench_text(result))
        return 0
    return serve(config, ServeOptions(host=args.host, port=args.port, api_key=args.api_key,
                                      queue_size=args.queue_size, max_body_bytes=args.max_body_bytes,
                                      max_tokens=args.max_tokens, access_log=args.access_log,
                                      timeouts=timeouts_from_args(args)),
                 speculation=lambda: speculation_from_args(args),
                 prompt_cache=lambda engine, tokenizer: prompt_cache_from_args(args, engine, tokenizer))


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(  # help: every path api_router (serve/app.py) serves, no more, as tests/cli/test_cli.py checks
        "serve", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="OpenAI's API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/responses/{response_id}, "
             "/v1/models, /v1/models/{model}), Anthropic's (/v1/messages, /v1/messages/count_tokens), the tokenizer "
             "(/tokenize, /detokenize, /tokenizer_info) and /health",
        description="Serves one resident engine over the OpenAI HTTP API, so the `openai` package, curl, editors\n"
                    "and agents can use k3. Concurrent requests are advanced together (--sequences), each\n"
                    "reply the bits it gets alone; a follow-up turn forwards only its new tokens. Listens on\n"
                    f"127.0.0.1 unless --host says otherwise, and any other address needs an API key ({KEY_ENV}).\n"
                    "docs/SERVER.md has curl and openai examples.",
        epilog="examples:\n"
               "  k3 serve demo-model\n"
               "  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
               "       -d '{\"model\": \"demo-model\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'\n"
               f"  {KEY_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(24))') \\\n"
               "       k3 serve /models/K3 --trunk /models/K3-trunk --host 0.0.0.0\n\n" + EXIT_CODES)
    add_engine_arguments(p)
    g = p.add_argument_group("server")
    add_server_arguments(g, default_port=8000, host_guard=KEY_GUARD)
    g.add_argument("--sequences", type=int, default=4, metavar="N",
                   help="requests advanced together in one forward pass (default 4; the memory plan holds a decode "
                        "state for each)")
    g.add_argument("--max-tokens", type=positive_int, default=1024, metavar="N",
                   help="reply length for a request that names no max_tokens (default 1024; never past the context)")
    g.add_argument("--max-body-bytes", type=positive_int, default=4 << 20, metavar="N",
                   help="larger request bodies get 413 (default 4 MiB)")
    add_speculation_arguments(p)
    add_prompt_cache_arguments(p)
    g = p.add_argument_group("benchmark (instead of serving clients)")
    g.add_argument("--bench", type=positive_int, metavar="N", help="serve N streaming chat requests one after another, "
                   "then all at once, on a loopback port; print the aggregate tokens/s of each and whether every "
                   "reply was the same")
    g.add_argument("--bench-tokens", type=positive_int, default=32, metavar="N", help="tokens per reply (default 32)")
    g.add_argument("--json", action="store_true", help="print the benchmark as JSON")
    add_logging_arguments(p, access_log=True)
    p.set_defaults(func=cmd_serve)
    return p


@hookimpl
def k3_subcommands(subparsers):
    add_parser(subparsers)
