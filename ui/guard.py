"""What a client of the page may change. Running Setup (it writes files), opening the saved profile for
everyone and applying memory budgets (they change what every session sees) are off unless `k3 ui` was
started with --allow-admin or with a login (--auth). When on, Setup writes only under the models root
(--models-root, default the directory `k3 ui` started in), from the demo or a Hub repository — never
into a source directory — and a refused destination is refused before anything is created. A source or
path holding a control character (a NUL), or one the OS cannot take, is refused naming the field.
Checked by tests/ui/test_guard.py.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from k3core.errors import UsageError

ADMIN_FLAG = "--allow-admin"


@dataclass(frozen=True)
class Guard:
    admin: bool                 # may clients run Setup, switch the model, change budgets?
    models_root: Path           # the only place Setup may write

    def check_admin(self, action: str) -> None:
        if not self.admin:
            raise UsageError(f"{action} is off on this page: it changes what every session of `k3 ui` sees or "
                             f"writes files. Start `k3 ui {ADMIN_FLAG}` (or with --auth USER:PASSWORD) to allow it")

    def destination(self, source: str, dest: str, trunk_dir: str | None) -> tuple[Path, Path]:
        """(destination, packed-trunk directory) for a Setup from the page, both inside the models root;
        refused with UsageError (nothing created) otherwise."""
        self.check_admin("Setup")
        source = check_text(source or "", "source") or "demo"
        if source != "demo" and not source.startswith("hf://"):
            raise UsageError(f"the page sets up the demo or a Hub repository (hf://OWNER/NAME), not {source!r}: a "
                             "local checkpoint is set up in place, writing into it, so run `k3 setup --source DIR` "
                             "in a terminal")
        if not (dest or "").strip():
            raise UsageError(f"give a destination under {self.models_root}")
        paths = [self._inside(dest, "destination")]
        paths.append(self._inside(trunk_dir, "packed trunk directory") if (trunk_dir or "").strip()
                     else paths[0] / "trunk")
        return paths[0], paths[1]

    def _inside(self, text: str, what: str) -> Path:
        root = Path(os.path.realpath(self.models_root))
        text = check_text(text, what)
        try:
            given = Path(text).expanduser()
            path = Path(os.path.realpath(given if given.is_absolute() else root / given))
            is_file = path.exists() and not path.is_dir()
        except (OSError, RuntimeError, ValueError) as exc:  # a name too long, an unknown ~user
            raise UsageError(f"the {what} {text[:60]!r} cannot be used: {getattr(exc, 'strerror', None) or exc}; "
                             "nothing was written") from None
        if path == root or root not in path.parents:
            raise UsageError(f"the {what} {text!r} is not inside the models root {root} "
                             f"(k3 ui --models-root DIR sets it); nothing was written")
        if is_file:
            raise UsageError(f"the {what} {path} is a file, not a directory; nothing was written")
        return path


def check_text(text, what: str) -> str:
    """A path or source field's text, stripped; refused by name when it is not text or holds a control
    character (a NUL would reach the OS as "embedded null byte")."""
    if not isinstance(text, str):
        raise UsageError(f"the {what} must be text, got {type(text).__name__}; nothing was written")
    bad = next((i for i, c in enumerate(text) if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise UsageError(f"the {what} contains a control character ({text[bad]!r} at position {bad}): give it "
                         "without one; nothing was written")
    return text.strip()
