"""The red-team table: one case per corruption × command, each asserting the exit code (or HTTP status) and
that the message names the thing at fault. `make test` runs every case not marked `faults_full`; `make
faults` runs them all (K3_FAULTS_FULL=1). A case is a row of a table in its group's file (test_<group>.py),
so adding one hostile input is adding one row."""
from __future__ import annotations

import os

import pytest

FULL = os.environ.get("K3_FAULTS_FULL") == "1"


def pytest_collection_modifyitems(config, items):
    if FULL:
        return
    skip = pytest.mark.skip(reason="the full fault table runs under `make faults`")
    for item in items:
        if "faults_full" in item.keywords:
            item.add_marker(skip)
