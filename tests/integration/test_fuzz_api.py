"""The push API fuzzed by a third-party OpenAPI fuzzer (Schemathesis) against a daemon on real etcd.

The daemon runs with a token and no Traefik, as a coordinator team would try it. Positive mode
fuzzes the sidecar's own contract (`openapi --config`), in the fuzzing phase (whose bodies keep the
uniqueness rules, tests/fuzz_hooks.py; the coverage phase's boundary values do not pass through the
hooks and run under every check below): nearly every generated push is accepted,
and what is refused is refused only by a rule the contract names. Negative mode fuzzes the
published docs/openapi.yaml: every answer is declared, with the Error body, never a 5xx. Then
every check Schemathesis has, the stateful phase over the links included. The seed is random and
printed (FUZZ_SEED replays one); the daemon's output stays JSON lines throughout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporter.embedded import EmbeddedEtcd, free_port
from exporter.sources.contract.schemas import RULES
from tests.helpers import eventually, is_ready, start_daemon, stop_daemon, uid

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TOKEN = "fuzz-token-not-secret"
# What each mode may answer a push; positive mode must accept at least 95 % of its pushes.
ACCEPTED = (204, 409)
SEED = int(os.environ.get("FUZZ_SEED") or random.randrange(2**31))


@dataclass
class Fuzzed:
    """A daemon under the fuzzer: its push API, its own contract, its log."""

    url: str
    spec: Path
    log: Path
    workdir: Path


@pytest.fixture(scope="module")
async def fuzzed(etcd: EmbeddedEtcd, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Fuzzed]:
    work = tmp_path_factory.mktemp("fuzz")
    space = uid("fuzz")
    (work / "token").write_text(TOKEN)
    api, control = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    config = work / "exporter.yaml"
    config.write_text(
        f'etcd: {{endpoints: ["{etcd.url}"]}}\nroot_key: "{space}/worker_{{authority}}"\nrecords_prefix: "{space}/records"\n'
        f'api: {{listen: "{api}", token_file: token}}\ncontrol: {{listen: "{control}"}}\nlog: {{format: json}}\n'
    )
    spec = work / "own.yaml"
    spec.write_text(subprocess.run(
        [sys.executable, "-m", "exporter", "openapi", "--config", str(config)], capture_output=True, text=True, check=True,
    ).stdout)
    log = work / "daemon.log"
    proc = start_daemon(config, log)
    try:
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: is_ready(session, f"http://{control}"), timeout=30)
        yield Fuzzed(f"http://{api}", spec, log, work)
    finally:
        stop_daemon(proc)


def schemathesis(fuzzed: Fuzzed, spec: Path, name: str, *args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One Schemathesis run at SEED; fails the test with its report unless it passed. Returns the HAR entries
    (the run's summary first, as {"summary": text})."""
    har = fuzzed.workdir / f"{name}.har"
    print(f"schemathesis {name}: seed {SEED} (FUZZ_SEED={SEED} replays it)")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(REPO / "tests" / "schemathesis.toml"),
         "run", str(spec), "--url", fuzzed.url,
         "-H", f"Authorization: Bearer {TOKEN}", "--seed", str(SEED), "--no-color", "--report", "har",
         "--report-har-path", str(har), "--output-sanitize", "true",
         # Valid and invalid data are both drawn by filtering candidates: at some seeds (788793566 negative,
         # 2059957653 positive) Hypothesis's filter health check stops an operation before or after its
         # requests were judged. Each test's own counts judge its run.
         "--suppress-health-check", "filter_too_much", *args],
        capture_output=True, text=True, timeout=300, cwd=fuzzed.workdir,
        env={**os.environ, "PYTHONPATH": str(REPO), "SCHEMATHESIS_HOOKS": "tests.fuzz_hooks", **(env or {})},
    )
    assert done.returncode == 0, f"seed {SEED}\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    entries: list[dict[str, Any]] = json.loads(har.read_text())["log"]["entries"]
    return [{"summary": done.stdout}, *entries]


def _pushes(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries[1:] if e["request"]["method"] == "POST" and "/v2/ingress/" in e["request"]["url"]]


def _messages(entry: dict[str, Any]) -> list[str]:
    body = json.loads(entry["response"]["content"].get("text") or "{}")
    return [f'{e["loc"]}: {e["msg"]}' for e in body.get("data", {}).get("errors", [])] or [body.get("title", "")]


def _named(message: str) -> bool:
    return any(rule in message for rule in RULES.values())


def test_positive_pushes_are_accepted_and_every_refusal_is_a_named_rule(fuzzed: Fuzzed) -> None:
    entries = schemathesis(
        fuzzed, fuzzed.spec, "positive", "--mode", "positive", "--phases", "fuzzing", "-n", "60", "--no-shrink", "-w", "2",
        "-c", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
        env={"FUZZ_UNIQUE": "1"},
    )
    pushes = _pushes(entries)
    statuses = Counter(e["response"]["status"] for e in pushes)
    accepted = sum(statuses[s] for s in ACCEPTED) / len(pushes)
    print(f"positive: {len(pushes)} pushes, {statuses}, {accepted:.1%} answered 204 or 409")
    refused = [m for e in pushes if e["response"]["status"] not in ACCEPTED for m in _messages(e)]
    assert len(pushes) >= 100
    assert [m for m in refused if not _named(m)] == [], f"seed {SEED}: refusals by a rule the contract does not name"
    assert accepted >= 0.95, f"seed {SEED}: {Counter(refused).most_common(10)}"


def test_negative_pushes_get_a_declared_error_and_never_a_5xx(fuzzed: Fuzzed) -> None:
    entries = schemathesis(
        fuzzed, REPO / "docs" / "openapi.yaml", "negative", "--mode", "negative", "--phases", "coverage,fuzzing",
        "-n", "20", "--no-shrink", "-w", "2",
        "-c", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,negative_data_rejection,"
        "unsupported_method,allow_header_conformance,missing_required_header",
    )
    assert any(e["response"]["status"] == 405 for e in entries[1:]), "an undeclared method was tried"
    pushes = _pushes(entries)
    statuses = Counter(e["response"]["status"] for e in pushes)
    print(f"negative: {len(pushes)} pushes, {statuses}")
    assert len(pushes) >= 100
    # Schemathesis judged each answer declared and each schema-invalid push refused; none is a 5xx.
    assert not [s for s in statuses if s >= 500], statuses
    assert statuses[400] > 0.9 * len(pushes), statuses


def test_every_check_and_the_stateful_phase_over_the_links_pass(fuzzed: Fuzzed) -> None:
    entries = schemathesis(
        fuzzed, fuzzed.spec, "all", "--mode", "positive", "-n", "10", "--no-shrink", "-w", "2", "-c", "all",
        env={"FUZZ_UNIQUE": "1"},
    )
    methods = Counter((e["request"]["method"], e["response"]["status"]) for e in entries[1:])
    print(f"all: {len(entries) - 1} requests, {methods}")
    assert methods[("GET", 200)] > 0 and methods[("POST", 204)] > 0
    assert any(status == 401 for _, status in methods), "the auth checks sent a wrong or missing token"
    assert re.search(r"✅\s+Stateful", entries[0]["summary"]), entries[0]["summary"][-3000:]


def test_the_daemons_output_stayed_json_lines(fuzzed: Fuzzed) -> None:
    # Whole lines only: the daemon may be writing the last one.
    lines = fuzzed.log.read_text().split("\n")[:-1]
    assert len(lines) > 100
    for line in lines:
        json.loads(line)


async def test_models_generated_from_the_published_document_push_and_read_back(fuzzed: Fuzzed) -> None:
    module = fuzzed.workdir / "coordinator_models.py"
    subprocess.run(
        [str(Path(sys.executable).parent / "datamodel-codegen"), "--input", str(REPO / "docs" / "openapi.yaml"),
         "--input-file-type", "openapi", "--output-model-type", "pydantic_v2.BaseModel", "--output", str(module)],
        check=True, capture_output=True, timeout=120,
    )
    spec = importlib.util.spec_from_file_location("coordinator_models", module)
    assert spec is not None and spec.loader is not None
    models = importlib.util.module_from_spec(spec)
    sys.modules["coordinator_models"] = models
    spec.loader.exec_module(models)
    authority = uid("client")
    ingress = models.HttpIngress(
        authority=authority, id="chat", revision=1, hosts=["chat.client.test"],
        upstream=models.HttpUpstream(models.ServersUpstream(servers=[models.HttpServer(url="http://127.0.0.1:9", weight=1)])),
    )
    body = models.UpsertRequest(ingresses=[models.Ingress(ingress)]).model_dump_json(exclude_none=True, by_alias=True)
    with pytest.raises(ValueError):
        models.HttpServer(url="http://Not_A_Host:80")  # refused by the client, as the daemon would
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(f"{fuzzed.url}/v2/ingress/upsert", data=body) as resp:
            assert resp.status == 204, await resp.text()
        async with session.get(f"{fuzzed.url}/v2/ingress", params={"authority": authority}) as resp:
            listed = (await resp.json())["ingresses"]
    stored = [models.StoredIngress.model_validate(entry) for entry in listed]
    assert [(s.id, s.revision, s.status.committed_revision > 0) for s in stored] == [("chat", 1, True)]
