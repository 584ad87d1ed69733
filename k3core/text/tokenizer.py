"""Kimi K3's tokenizer (MODEL.md §7): a tiktoken BPE over `tiktoken.model`, plus the added tokens of
`tokenizer_config.json`, split by the pat_str of §7 or by a shipped `tokenization_kimi.py`'s (read, never run).
Raw text only: no BOS is added and chat markup is rendered elsewhere. Checked token for token
against a tiktoken Encoding built independently from the same files (tests/text/test_tokenizer.py).
"""
from __future__ import annotations

import ast
import base64
import binascii
import codecs
import operator
from pathlib import Path

import tiktoken

from ..errors import InputError, TokenizerError
from ..files.limits import SMALL_FILE_BYTES, loads_limited, read_limited

# The o200k pattern with a leading Han rule and Han taken out of the letter classes. `&&` is a
# class intersection: tiktoken's engine (and `regex` in V1 mode) honour it; Python's `re` does not.
PAT_STR = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
RANKS_FILE, CONFIG_FILE, KIMI_FILE = "tiktoken.model", "tokenizer_config.json", "tokenization_kimi.py"
MAX_VOCAB = 1 << 24  # ids are below this: K3 has ~164k; a vocabulary-sized row of float32 logits is then <= 64 MiB
# text every tokenizer must encode at load: letters of several scripts, digits, punctuation, whitespace runs
PROBE = "Hello, World! It's 2026: 3.14 + 42 = 45.14?\n\tnaïve café 北京 東京 ありがとう 👋🏽  \r\n end"


def read_ranks(path: Path) -> dict[bytes, int]:
    """{token bytes: rank} from lines `base64(bytes) rank`; ranks must be exactly 0..N-1 and
    include every single byte (tiktoken cannot encode a byte it has no token for)."""
    try:
        lines = read_limited(path, SMALL_FILE_BYTES, "a BPE ranks file").splitlines()
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read the BPE ranks: {e.strerror or e}") from None
    ranks: dict[bytes, int] = {}
    seen: dict[int, int] = {}  # rank -> line number
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError
            token, rank = base64.b64decode(fields[0], validate=True), int(fields[1])
            if rank < 0 or not token:
                raise ValueError
        except (ValueError, binascii.Error):
            raise TokenizerError(f"{path}:{no}: expected 'base64(token bytes) rank', got {line[:80]!r}") from None
        if rank in seen:
            raise TokenizerError(f"{path}:{no}: rank {rank} already given on line {seen[rank]}")
        if token in ranks:
            raise TokenizerError(f"{path}:{no}: token {token!r} already has rank {ranks[token]}")
        ranks[token], seen[rank] = rank, no
    if not ranks:
        raise TokenizerError(f"{path}: no BPE ranks in the file")
    if len(ranks) != max(seen) + 1:
        gap = min(set(range(len(ranks))) - set(seen))
        raise TokenizerError(f"{path}: ranks must run 0..{len(ranks) - 1} without gaps; rank {gap} is missing")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TokenizerError(f"{path}: {len(missing)} single-byte token(s) missing, e.g. {bytes(missing[:1])!r}")
    return ranks


def read_tokenizer_config(path: Path, n_ranks: int) -> tuple[dict, dict[str, int], frozenset[int]]:
    """(the whole config, {content: id}, ids marked special) from tokenizer_config.json; the
    added tokens' ids come from its `added_tokens_decoder`."""
    try:
        cfg = loads_limited(read_limited(path, SMALL_FILE_BYTES, "a tokenizer config").decode("utf-8"), path)
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read the tokenizer config: {e.strerror or e}") from None
    except ValueError as e:
        raise TokenizerError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    decoder = cfg.get("added_tokens_decoder", {})
    if not isinstance(decoder, dict):
        raise TokenizerError(f"{path}: added_tokens_decoder must be an object {{id: {{content, special}}}}")
    added: dict[str, int] = {}
    special = set()
    for key, entry in decoder.items():
        where = f"{path}: added_tokens_decoder[{key!r}]"
        content = entry.get("content") if isinstance(entry, dict) else None
        if not (key.isascii() and key.isdigit()) or not isinstance(content, str) or not content:
            raise TokenizerError(f"{where}: expected a decimal id and {{\"content\": non-empty string, ...}}")
        if len(key) > 9 or (tid := int(key)) >= MAX_VOCAB:
            raise TokenizerError(f"{where}: id {key[:20]} is past the bound on a vocabulary: ids must be below "
                                 f"{MAX_VOCAB:,} (MAX_VOCAB, k3core/text/tokenizer.py)")
        if tid < n_ranks:
            raise TokenizerError(f"{where}: id {tid} collides with a BPE rank (tiktoken.model has 0..{n_ranks - 1})")
        if content in added:
            raise TokenizerError(f"{where}: {content!r} already has id {added[content]}")
        added[content] = tid
        if entry.get("special", False) is True:
            special.add(tid)
    return cfg, added, frozenset(special)


def _static_str(node: ast.AST):
    """The string an expression denotes if it is built only from literals, else None."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _static_str(node.left), _static_str(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], (ast.List, ast.Tuple)):
        sep = _static_str(node.func.value)
        parts = [_static_str(e) for e in node.args[0].elts]
        return None if sep is None or None in parts else sep.join(parts)
    return None


def pat_str_from_source(path: Path) -> str:
    """The `pat_str` a tokenization_kimi.py assigns, found by parsing it: the file is never run."""
    try:
        tree = ast.parse(read_limited(path, SMALL_FILE_BYTES, "a tokenizer source").decode("utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError) as e:
        raise TokenizerError(f"{path}: cannot parse to find pat_str: {e}") from None
    values = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
        if any(getattr(t, "id", getattr(t, "attr", None)) == "pat_str" for t in targets):
            value = _static_str(node.value)
            if value is None:
                raise TokenizerError(f"{path}:{node.lineno}: pat_str is not a string literal or a join of literals; "
                                     "k3 does not execute the file to compute it")
            values.append(value)
    if not values:
        raise TokenizerError(f"{path}: no assignment to pat_str found")
    if len(set(values)) > 1:
        raise TokenizerError(f"{path}: pat_str is assigned {len(set(values))} different values")
    return values[0]


class Tokenizer:
    """Encode raw text to ids and back. Ids: BPE ranks 0..n_ranks-1, then the added tokens."""

    def __init__(self, directory: Path, encoding: tiktoken.Encoding, ranks: dict[bytes, int], config: dict,
                 added: dict[str, int], special_ids: frozenset[int], pat_str: str, pat_source: str):
        self.directory, self.encoding, self.pat_source = directory, encoding, pat_source
        self.config = config  # tokenizer_config.json as read (chat_template, bos_token, ...)
        self.ranks, self.pat_str = ranks, pat_str  # what the encoding was built from (structured.py builds from them too)
        self.n_ranks = len(ranks)
        self.added_tokens = dict(added)  # {content: id}
        self.special_ids = special_ids  # the added tokens marked "special"
        self.vocab_size = max([self.n_ranks - 1, *added.values()]) + 1
        self._added_ids = frozenset(added.values())

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Token ids of raw text, with no BOS added. By default text that looks like an added
        token (e.g. a literal "<|open|>" in a user's prompt) is encoded as ordinary text, so
        prompts cannot inject chat markup; allow_special=True turns such text into the token's id."""
        try:
            if allow_special:
                return self.encoding.encode(text, allowed_special="all")
            return self.encoding.encode_ordinary(text)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as e:  # noqa: BLE001 - tiktoken's Rust panics are BaseExceptions
            raise TokenizerError(f"{self.pat_source}: the pat_str fails on this text ({type(e).__name__}: "
                                 f"{str(e)[:120]})") from None

    def _check(self, token_id) -> int:
        try:
            tid = operator.index(token_id)  # ints and numpy integers; not floats
        except TypeError:
            raise InputError(f"token id {token_id!r} is not an integer") from None
        if not (0 <= tid < self.n_ranks or tid in self._added_ids):
            raise InputError(f"token id {tid} is not in the vocabulary of {self.directory} "
                             f"(ranks 0..{self.n_ranks - 1} and {len(self._added_ids)} added tokens)")
        return tid

    def token_bytes(self, token_id: int) -> bytes:
        return self.encoding.decode_single_token_bytes(self._check(token_id))

    def decode(self, ids) -> str:
        """Text of the ids; bytes that are not valid UTF-8 become U+FFFD."""
        return self.encoding.decode_bytes([self._check(i) for i in ids]).decode("utf-8", errors="replace")

    def id_of(self, content: str) -> int:
        """The id of an added token, e.g. id_of("<|open|>")."""
        try:
            return self.added_tokens[content]
        except KeyError:
            raise TokenizerError(f"{self.directory / CONFIG_FILE}: no added token {content!r}") from None

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self)


class StreamDecoder:
    """Incremental decode: push(id) returns only complete UTF-8 text, holding back the
    incomplete tail of a character that continues in a later token; flush() ends the stream.
    Everything pushed and flushed joins to exactly decode(ids)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self.tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is held back (as U+FFFD: it was an incomplete character); the decoder resets."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text


def load_tokenizer(directory) -> Tokenizer:
    """The tokenizer of a checkpoint directory (tiktoken.model + tokenizer_config.json)."""
    directory = Path(directory)
    ranks = read_ranks(directory / RANKS_FILE)
    config, added, special_ids = read_tokenizer_config(directory / CONFIG_FILE, len(ranks))
    kimi = directory / KIMI_FILE
    pat_str, source = (pat_str_from_source(kimi), str(kimi)) if kimi.exists() else (PAT_STR, "MODEL.md §7")
    try:
        encoding = tiktoken.Encoding(f"k3:{directory.name}", pat_str=pat_str, mergeable_ranks=ranks,
                                     special_tokens=added)
    except ValueError as e:  # the pattern does not compile in tiktoken's regex engine
        raise TokenizerError(f"{source}: tiktoken rejects the pat_str: {e}") from None
    tokenizer = Tokenizer(directory, encoding, ranks, config, added, special_ids, pat_str, source)
    tokenizer.encode(PROBE)  # a pattern that compiles but panics on text is refused here, not mid-conversation
    return tokenizer
