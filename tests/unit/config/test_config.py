"""Configuration: YAML file, env overrides, clear errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from exporter.config import Settings, load_settings
from exporter.errors import ConfigError
from tests.helpers import REPO


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
    assert s.secret("api.token") == "s3cret"


def _path_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every field of the settings whose values are paths or globs (at any depth), with its annotation."""
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _path_fields(annotation, f"{prefix}{name}.")
        elif "Path" in repr(annotation) or name in ("files",):
            yield f"{prefix}{name}", (annotation, info.metadata)


def test_every_path_field_resolves_against_the_config_file(tmp_path: Path) -> None:
    """A path field added later is resolved as well (one walk over the marked fields), not against the cwd."""
    fields = dict(_path_fields(Settings))
    assert len(fields) >= 14, fields
    unmarked = [name for name, annotation in fields.items() if "RelativeToConfig" not in repr(annotation)]
    assert unmarked == []
    values: dict[str, Any] = {}
    for name, annotation in fields.items():
        section, _, field = name.rpartition(".")
        values.setdefault(section, {})[field] = [f"rel/{field}"] if "list" in repr(annotation) else f"rel/{field}"
    cfg = tmp_path / "exporter.yaml"
    nested: dict[str, Any] = {}
    for section, fields_of in values.items():
        node = nested
        for part in section.split("."):
            node = node.setdefault(part, {})
        node.update(fields_of)
    cfg.write_text(json.dumps(nested))
    s = load_settings(cfg)
    for name in fields:
        found: Any = s
        for part in name.split("."):
            found = getattr(found, part)
        for item in found if isinstance(found, list) else [found]:
            assert Path(item) == tmp_path / "rel" / name.rsplit(".", 1)[1], name


def test_token_from_env_wins_and_is_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPORTER_API__TOKEN", "from-env-secret")
    s = load_settings(None)
    assert s.secret("api.token") == "from-env-secret"
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

    from exporter.config.reference import reference_markdown

    doc = REPO / "docs" / "configuration.md"
    assert doc.read_text() == reference_markdown(), "run: traefik-etcd-exporter config-reference > docs/configuration.md"
