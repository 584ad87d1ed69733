"""`k3 bench`: the benchmark commands, one module each — kernels (the native products on K3 shapes), stream
(budgets), pair (two engines in one process), codec (the lossless trunk), decode and drafts (several positions per
pass; draft acceptance on transcripts, with transcripts.py and tokenizer.py), project (the real model by RAM, drawn
by chart.py), structured (constrained decoding's cost), agent (the prompt cache on agents' conversations), prefill
(prefill chunks) and draft (a draft trunk's proposals). Each registers its subcommand here; the CLI around them
keeps the argument parsing and dispatch.
"""
from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    from .agent import add_parser as add_agent
    from .codec import add_parser as add_codec
    from .decode import add_drafts_parser, add_parser as add_decode
    from .draft import add_parser as add_draft
    from .kernels import add_parser as add_kernels
    from .pair import add_parser as add_pair
    from .prefill import add_parser as add_prefill
    from .project import add_parser as add_project
    from .stream import add_parser as add_stream
    from .structured import add_parser as add_structured

    bench = subparsers.add_parser("bench", help="measure kernel and memory throughput on this machine",
                                  description="Benchmarks on this machine; `k3 bench BENCH --help` explains each.",
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = bench.add_subparsers(dest="bench_command", metavar="BENCH")
    bench.set_defaults(func=lambda args: bench.print_help() or 2)
    for add in (add_kernels, add_stream, add_pair, add_codec, add_decode, add_drafts_parser, add_project,
                add_structured, add_agent, add_prefill, add_draft):
        add(sub)
