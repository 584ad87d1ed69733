"""The browser check runs only under `make browser-check` (K3_BROWSER_CHECK=1), which installs
Playwright and Debian's chromium first; plain `make test` skips it and needs neither."""
import os
import shutil

import pytest

CHROMIUM = os.environ.get("K3_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def pytest_collection_modifyitems(config, items):
    if os.environ.get("K3_BROWSER_CHECK") == "1":
        return
    skip = pytest.mark.skip(reason="browser check: run `make browser-check` (Playwright + Debian chromium)")
    for item in items:
        if "tests/browser" in str(item.fspath):
            item.add_marker(skip)
