"""What `render` prints for the example ingresses, and the records stored for them, never change by accident.

The golden files hold the keys the examples rendered to before tcp allowlists were enforced
(docs/key-layout.md): every shape the exporter accepts without a tcp allowlist, docs/ingress.md's
example (its first YAML block) and the compose examples. A deliberate change of the rendered
keys updates a golden file in the same commit and says why.

The stored records are held the same way (`<input>.records.txt`: each ingress's record and the
tombstone its removal leaves, as etcd holds them): records written by one version are read by
the next, so their bytes change only on purpose. `GOLDEN_WRITE=1` rewrites the record files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from exporter.cli import main
from exporter.sources.files import load_ingress_file
from exporter.store.records import Record, decode_record
from tests.helpers import REPO

GOLDEN = REPO / "tests" / "golden"
INPUTS = {
    "docs-ingress": REPO / "docs" / "ingress.md",
    "compose-whoami": REPO / "compose" / "ingresses" / "whoami.yaml",
    "compose-two-fleets": REPO / "compose" / "two-fleets" / "ingresses-batch" / "jobs.yaml",
    "shapes": GOLDEN / "ingresses.yaml",
}


def ingress_file(name: str, tmp_path: Path) -> Path:
    """The ingress file of one input: a Markdown document's first YAML block, or the file itself."""
    source = INPUTS[name]
    if source.suffix != ".md":
        return source
    block = re.search(r"```yaml\n(.*?)```", source.read_text(), re.S)
    assert block is not None, f"{source} has no YAML block"
    path = tmp_path / f"{name}.yaml"
    path.write_text(block.group(1))
    return path


def rendered(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What `traefik-etcd-exporter render` prints for one input."""
    config = tmp_path / "exporter.yaml"
    config.write_text('etcd: {endpoints: ["http://127.0.0.1:9"]}\n')
    capsys.readouterr()
    assert main(["render", "--config", str(config), str(ingress_file(name, tmp_path))]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_render_output_is_byte_identical_to_its_golden_file(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert rendered(name, tmp_path, capsys) == (GOLDEN / f"{name}.txt").read_text()


def stored(name: str, tmp_path: Path) -> str:
    """Each ingress's stored record and the tombstone of its removal, one per line, by key."""
    lines = []
    for loaded in sorted(load_ingress_file(ingress_file(name, tmp_path)), key=lambda r: r.key):
        live = Record.of(loaded.ingress)  # the API's source: no file path in the bytes
        tombstone = live.removal(live.revision + 1, 1_700_000_000.5)
        for record in (live, tombstone):
            assert decode_record(record.value).value == record.value  # read back to the same bytes
            lines.append(f"{record.key} = {record.value}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_stored_records_are_byte_identical_to_their_golden_file(name: str, tmp_path: Path) -> None:
    golden = GOLDEN / f"{name}.records.txt"
    if os.environ.get("GOLDEN_WRITE") == "1":
        golden.write_text(stored(name, tmp_path))
    assert stored(name, tmp_path) == golden.read_text()

