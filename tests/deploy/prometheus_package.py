"""The binaries of Debian's `prometheus` package, which CI installs (.ci/run): there, missing is a failure."""

from __future__ import annotations

import os
import shutil

import pytest


def debian_binary(name: str) -> str:
    """The path of `prometheus` or `promtool`; skips the test where it is not installed (outside CI)."""
    found = shutil.which(name)
    if found is None:
        assert not os.environ.get("CI"), f"{name} is missing: install Debian's prometheus package"
        pytest.skip(f"{name} is not installed here (Debian's prometheus package)")
    return found
