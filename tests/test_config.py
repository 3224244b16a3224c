"""Configuration: YAML file, env overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.config import load_settings
from exporter.errors import ConfigError


def test_defaults_match_the_design() -> None:
    s = load_settings(None)
    assert s.root_key == "traefik/worker_{authority}"
    assert s.records_prefix == "traefik-etcd-exporter/records"
    assert s.default_entrypoints == ["web"]
    assert s.api.listen == "127.0.0.1:8570" and s.control.listen == "127.0.0.1:8571"
    assert s.etcd.max_txn_ops is None and s.etcd.max_request_bytes is None  # detected from etcd
    assert s.layout().root("edge") == "traefik/worker_edge"


def test_yaml_file_with_env_override_and_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(
        'etcd: {endpoints: ["http://127.0.0.1:2379"]}\nsources: {files: ["ingresses/*.yaml"]}\n'
        'api: {token_file: api-token}\ndefault_entrypoints: [web, websecure]\n'
    )
    (tmp_path / "api-token").write_text("s3cret\n")
    monkeypatch.setenv("EXPORTER_ETCD__ENDPOINTS", '["http://127.0.0.1:2479"]')
    monkeypatch.setenv("EXPORTER_WRITER__COALESCE_WINDOW", "0.05")
    s = load_settings(cfg)
    assert s.etcd.endpoints == ["http://127.0.0.1:2479"]
    assert s.writer.coalesce_window == 0.05
    assert s.default_entrypoints == ["web", "websecure"]
    assert s.sources.files == [str(tmp_path / "ingresses/*.yaml")]
    assert s.api_token() == "s3cret"


def test_token_from_env_wins_and_is_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPORTER_API__TOKEN", "from-env-secret")
    s = load_settings(None)
    assert s.api_token() == "from-env-secret"
    assert "from-env-secret" not in repr(s) and "from-env-secret" not in s.model_dump_json()


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("root_key: /traefik/\n", "root_key"),
        ("root_key: 'traefik/{other}'\n", "root_key"),
        ("etcd: {endpoints: [localhost]}\n", "etcd.endpoints"),
        ("default_entrypoints: ['web,websecure']\n", "default_entrypoints"),
        ("api: {listen: nowhere}\n", "api.listen"),
        ("unknown_section: 1\n", "unknown_section"),
        ("etcd: {max_txn_ops: 2}\n", "etcd.max_txn_ops"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, yaml_text: str, field: str) -> None:
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert field in [e["loc"] for e in info.value.data["errors"]]


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")


def test_configuration_reference_is_current() -> None:
    from pathlib import Path

    from exporter.config import reference_markdown

    doc = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
    assert doc.read_text() == reference_markdown(), "run: traefik-etcd-exporter config-reference > docs/configuration.md"
