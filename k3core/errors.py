"""The errors k3 raises on bad input, each carrying the exit code the CLI uses.

Every message names the file, field or tensor at fault; nothing here prints or exits. This module imports nothing of
k3, so a few errors live beside the code that raises them instead (k3core/api.py's docstring names them).
"""

EXIT_CODES = """exit codes:
  0  success
  1  runtime failure (a bug in k3, or the machine ran out of memory)
  2  bad usage, config, checkpoint or input, or an output that cannot be written (the message names the
     flag, field, file or tensor)
  4  the run finished but its ids are unsound (an expert read failed); do not trust them
  130 interrupted (Ctrl-C)"""


class K3Error(Exception):
    """Base of every error k3 reports to a user instead of a traceback."""

    exit_code = 1


class UsageError(K3Error):
    """A command was called wrongly (bad flags, no prompt, two prompt sources)."""

    exit_code = 2


class ConfigError(K3Error):
    """config.json is missing fields, has ill-typed fields or breaks a validation rule."""

    exit_code = 2

    def __init__(self, path, problems):
        self.path = str(path)
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{self.path}: {len(self.problems)} problem(s) in the model config:\n{lines}")


class CheckpointError(K3Error):
    """A shard, its header or a tensor in it is unreadable, inconsistent or absent."""

    exit_code = 2

    def __init__(self, message, file=None, tensor=None):
        self.file = None if file is None else str(file)
        self.tensor = tensor
        where = ", ".join(x for x in (
            f"file {self.file}" if self.file else "",
            f"tensor {tensor!r}" if tensor else "") if x)
        super().__init__(f"{message} ({where})" if where else message)


class BindingError(CheckpointError):
    """The checkpoint lacks tensors the config implies, or has them with wrong shapes/dtypes."""

    def __init__(self, root, problems):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        K3Error.__init__(self, f"{root}: {len(self.problems)} tensor problem(s) against the config:\n{lines}")
        self.file, self.tensor = str(root), None


class TrunkError(CheckpointError):
    """A packed trunk (`k3 pack`) is missing, damaged, from another checkpoint, or cannot be written."""


class OutputError(K3Error):
    """A file the user asked for (--json, --dump-logits, /save ..., or standard output) could not be written: a full
    disk or device, an I/O error, a closed pipe. The message names the flag and the path. Exit 2: the user can fix
    it (free space, another path); exit 1 stays for k3's own bugs."""

    exit_code = 2


class InputError(K3Error):
    """A request the model cannot serve: token ids outside the vocabulary, an empty prompt."""

    exit_code = 2


class TokenizerError(K3Error):
    """tiktoken.model, tokenizer_config.json or tokenization_kimi.py is missing, malformed or inconsistent."""

    exit_code = 2


class PluginError(K3Error):
    """A plugin is missing, misnamed, or does not satisfy its interface."""

    exit_code = 2


class PlanError(K3Error):
    """The memory plan does not fit in the memory available, or a budget cannot hold what it must."""

    exit_code = 2


class UnsoundRunError(K3Error):
    """A run finished but its ids cannot be trusted (e.g. an expert read failed or came up short)."""

    exit_code = 4
