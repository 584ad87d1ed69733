"""Adds `k3 ui` through k3's `k3_subcommands` hook (entry point `ui = "ui.plugin"`), the same way a
third-party package would. Parsing only: Gradio is imported when the command runs, so every other
`k3` command starts as fast as before.
"""
from __future__ import annotations

import argparse

from k3core.cli.options import (EXIT_CODES, add_engine_arguments, add_logging_arguments, add_prompt_cache_arguments,
                                add_speculation_arguments, engine_config_from_args, prompt_cache_from_args,
                                speculation_from_args)
from k3core.report.logs import configure_logging
from k3core.plugin_api import hookimpl

from serve.http import add_server_arguments, timeouts_from_args

from .guard import ADMIN_FLAG
from .server import EXPOSE_FLAG, ServerOptions


def cmd_ui(args) -> int:
    from .server import serve

    configure_logging(args.log_level)
    config = engine_config_from_args(args)
    speculation_from_args(args)  # a bad --draft is refused before the engine loads
    return serve(config, server_options(args), speculation=lambda: speculation_from_args(args),
                 prompt_cache=lambda engine, tokenizer: prompt_cache_from_args(args, engine, tokenizer))


def server_options(args) -> ServerOptions:
    return ServerOptions(host=args.host, port=args.port, expose=args.expose, auth=args.auth,
                         queue_size=args.queue_size, keep_states=args.keep_states, access_log=args.access_log,
                         allow_admin=args.allow_admin, models_root=args.models_root, api_key=args.api_key,
                         timeouts=timeouts_from_args(args))


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "ui", formatter_class=argparse.RawDescriptionHelpFormatter, help="the chat page in your browser",
        description="A chat page (Gradio) over one engine: streaming replies with Stop, retry, undo and\n"
                    "sampling controls; a live engine panel (speed, memory, bytes read per token, layer\n"
                    "progress); Setup, Memory and Plugins tabs. Listens on 127.0.0.1 only, unless told\n"
                    f"otherwise with --host and {EXPOSE_FLAG}.",
        epilog="examples:\n"
               "  k3 ui                                   # the saved profile (k3 setup writes it)\n"
               "  k3 ui demo-model --port 7861\n"
               f"  k3 ui /models/K3 --host 0.0.0.0 {EXPOSE_FLAG} --auth me:secret\n\n" + EXIT_CODES)
    add_engine_arguments(p)
    g = p.add_argument_group("server")
    add_server_arguments(g, default_port=7860, host_guard=EXPOSE_FLAG)
    g.add_argument("--keep-states", type=int, default=2, metavar="N",
                   help="browser sessions whose decode state stays in memory (default 2; about 0.69 GB each on the "
                        "real model, counted in the memory plan); others resume from the prompt cache on their next "
                        "turn")
    g.add_argument(EXPOSE_FLAG, dest="expose", action="store_true",
                   help="allow --host to be a non-loopback address (prints a warning)")
    g.add_argument("--auth", metavar="USER:PASSWORD", help="require this login (or set K3_UI_AUTH); the password "
                   "is never printed. /v1 then asks for it too: clients send `Authorization: Bearer PASSWORD` (or "
                   "`x-api-key: PASSWORD` on /v1/messages), or the API key instead when one is set (--api-key, "
                   "K3_API_KEY)")
    g.add_argument(ADMIN_FLAG, dest="allow_admin", action="store_true",
                   help="let clients of the page run Setup, open the saved profile and change memory budgets — "
                        "actions that write files or change what every session sees (implied by --auth)")
    g.add_argument("--models-root", metavar="DIR", help="the only directory the Setup tab may write under "
                   "(default: the directory k3 ui starts in)")
    g = p.add_argument_group("chat")
    g.add_argument("--tok", metavar="DIR", help="tokenizer directory (default: MODEL_DIR)")
    add_speculation_arguments(p)
    add_prompt_cache_arguments(p)
    add_logging_arguments(p, access_log=True)
    p.set_defaults(func=cmd_ui)
    return p


@hookimpl
def k3_subcommands(subparsers):
    add_parser(subparsers)
