"""The saved profile: which model, packed trunk and memory preset `k3 run` / `k3 chat` / `k3 ui` use
when no MODEL_DIR is given, and the settings `k3 tune` measured fastest for it. The setup wizard writes it;
anyone may edit it (it is small JSON).

Location: $K3_CONFIG_DIR/profile.json, else $XDG_CONFIG_HOME/k3/profile.json, else
~/.config/k3/profile.json. Writes are atomic.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..files.atomic import write_json_atomic
from ..files.limits import SMALL_FILE_BYTES, read_json_limited
from ..errors import K3Error

FORMAT, VERSION = "k3-profile", 1


class ProfileError(K3Error):
    exit_code = 2


@dataclass
class Profile:
    model: str                    # checkpoint directory
    trunk: str | None = None      # packed trunk directory, or None for a resident trunk
    preset: str | None = None     # laptop | desktop | workstation | server | max
    trunk_gb: float | None = None
    cache_gb: float | None = None
    source: str | None = None     # where the model came from (hf://repo@sha, a path, demo)
    tuned: dict | None = None     # what `k3 tune` measured fastest here (k3core/plan/tuned.py reads it)


def profile_path() -> Path:
    if os.environ.get("K3_CONFIG_DIR"):
        return Path(os.environ["K3_CONFIG_DIR"]) / "profile.json"
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "k3" / "profile.json"


DEFAULT_PROMPT_CACHE_DISK_GB = 20.0  # disk for kept prompt states (`k3 doctor` counts it as what a model still needs)


def default_prompt_cache_dir() -> Path:
    """Where kept prompt states go on disk unless --prompt-cache says: $K3_CACHE_DIR/prompt-cache, else
    $XDG_CACHE_HOME/k3/prompt-cache, else ~/.cache/k3/prompt-cache."""
    if os.environ.get("K3_CACHE_DIR"):
        return Path(os.environ["K3_CACHE_DIR"]) / "prompt-cache"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "k3" / "prompt-cache"


def save_profile(profile: Profile, path: Path | None = None) -> Path:
    target = path or profile_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(target, {"format": FORMAT, "version": VERSION, **asdict(profile)})
    return target


def load_profile(path: Path | None = None) -> Profile | None:
    """The saved profile, or None when there is none; a damaged one is an error naming the file."""
    source = path or profile_path()
    if not source.exists():
        return None
    try:
        data = read_json_limited(source, SMALL_FILE_BYTES, "a k3 profile")
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(f"format {data.get('format')!r} version {data.get('version')!r}")
        fields = {k: data.get(k) for k in Profile.__dataclass_fields__}
        if not isinstance(fields["model"], str):
            raise ValueError("no model directory")
        if fields["tuned"] is not None and not isinstance(fields["tuned"], dict):
            raise ValueError("tuned is not an object")
        return Profile(**fields)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ProfileError(f"{source}: not a k3 profile ({exc}); run `k3 setup` again or delete it") from None
