"""A real etcd with client TLS and auth: the daemon works through it, survives token expiry, and names failures."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import SecretStr

from exporter.assembly import build_reconciler, etcd_client
from exporter.config import Settings
from exporter.daemon import Daemon
from exporter.embedded import etcd_binary, free_port, wait_http
from tests.etcd_cluster import etcdctl
from tests.helpers import record, uid

pytestmark = pytest.mark.integration
PASSWORD = "etcd-root-pw-5e1f"
TOKEN_TTL = 2


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def make_pki(directory: Path, name: str) -> None:
    """A CA, a server certificate for 127.0.0.1, and a client certificate without a CN."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])

    def builder(subject: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
        )

    constraints = x509.BasicConstraints(ca=True, path_length=None)
    ca = builder(ca_name, ca_key).add_extension(constraints, critical=True).sign(ca_key, hashes.SHA256())
    _write(directory / f"{name}-ca", ca, ca_key)
    server_key = _key()
    server = builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "etcd")]), server_key).add_extension(
        x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
    ).sign(ca_key, hashes.SHA256())
    _write(directory / f"{name}-server", server, server_key)
    # etcd 3.5.1's gateway answers 400 to a client certificate with a CommonName: none here.
    client_key = _key()
    client = builder(x509.Name([]), client_key).add_extension(
        x509.SubjectAlternativeName([x509.DNSName("exporter")]), critical=False
    ).sign(ca_key, hashes.SHA256())
    _write(directory / f"{name}-client", client, client_key)


@dataclass
class SecureEtcd:
    url: str
    pki: Path
    proc: subprocess.Popen[bytes]

    def tls(self, ca: str = "good") -> dict[str, str]:
        return {"ca_file": str(self.pki / f"{ca}-ca.pem"), "cert_file": str(self.pki / "good-client.pem"),
                "key_file": str(self.pki / "good-client.key")}


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    work = tmp_path_factory.mktemp("secure-etcd")
    make_pki(work, "good")
    make_pki(work, "other")
    client, peer = free_port(), free_port()
    url = f"https://127.0.0.1:{client}"
    with open(work / "etcd.log", "ab") as log:  # the child keeps its own copy open
        proc = subprocess.Popen(
            [
                etcd_binary(), "--name", "secure", "--data-dir", str(work / "data"),
                "--listen-client-urls", url, "--advertise-client-urls", url,
                "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"secure=http://127.0.0.1:{peer}", "--log-level", "warn",
                "--cert-file", str(work / "good-server.pem"), "--key-file", str(work / "good-server.key"),
                "--trusted-ca-file", str(work / "good-ca.pem"), "--client-cert-auth",
                "--auth-token", "simple", "--auth-token-ttl", str(TOKEN_TTL),
            ],
            stdout=log, stderr=subprocess.STDOUT,
        )
    context = ssl.create_default_context(cafile=str(work / "good-ca.pem"))
    context.load_cert_chain(str(work / "good-client.pem"), str(work / "good-client.key"))
    wait_http(f"{url}/health", time.monotonic() + 30, proc, "secure etcd", work / "etcd.log", context)
    ctl = [etcdctl(), f"--endpoints={url}", f"--cacert={work / 'good-ca.pem'}",
           f"--cert={work / 'good-client.pem'}", f"--key={work / 'good-client.key'}"]
    subprocess.run([*ctl, "user", "add", "root", f"--new-user-password={PASSWORD}"], check=True, capture_output=True)
    subprocess.run([*ctl, "auth", "enable"], check=True, capture_output=True)
    yield SecureEtcd(url, work, proc)
    proc.terminate()
    proc.wait(10)


def settings(etcd: SecureEtcd, **etcd_overrides: object) -> Settings:
    section = {"endpoints": [etcd.url], "timeout": 3, **etcd.tls(), "username": "root", "password": PASSWORD}
    section.update(etcd_overrides)
    return Settings.model_validate({"etcd": section, "records_prefix": f"{uid('sec')}/records", "writer": {"coalesce_window": 0.01}})


@pytest.mark.parametrize("transport", ["grpc", "gateway"])
async def test_the_daemon_works_through_tls_and_auth_and_survives_token_expiry(secure_etcd: SecureEtcd, transport: str) -> None:
    s = settings(secure_etcd, transport=transport)
    async with etcd_client(s) as client:
        rec = build_reconciler(s, client)
        await rec.start()
        try:
            await rec.wait_synced(20)
            iid = uid()
            await rec.submit([record(iid, upstream={"servers": [{"url": "http://127.0.0.1:9"}]})])
            assert (await client.get(f"{s.records_prefix}/test/{iid}")) is not None
            issued = client.tokens_issued
            assert issued >= 1
            # Stay idle past --auth-token-ttl. This wait is the scenario itself (an idle exporter),
            # not synchronization: any request made to check the token would keep it alive.
            await asyncio.sleep(TOKEN_TTL * 2.5)
            await rec.submit([record(iid, revision=2, upstream={"servers": [{"url": "http://127.0.0.1:8"}]})])
            kv = await client.get(f"{s.records_prefix}/test/{iid}")
            assert kv is not None and '"revision":2' in kv.value
            assert client.tokens_issued > issued  # renewed, and the write went through
        finally:
            await rec.stop()


def _diff(tmp_path: Path, etcd: SecureEtcd, **etcd_overrides: object) -> subprocess.CompletedProcess[str]:
    import yaml

    password = str(etcd_overrides.pop("password_env", PASSWORD))
    section: dict[str, object] = {"endpoints": [etcd.url], "timeout": 3, **etcd.tls(), "username": "root"}
    section.update(etcd_overrides)
    config = tmp_path / "exporter.yaml"
    config.write_text(yaml.safe_dump({"etcd": section}))
    # The password comes from the environment, never from the file.
    env = {"EXPORTER_ETCD__PASSWORD": password, "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "exporter", "diff", "--config", str(config)], capture_output=True, text=True, timeout=60,
                          env=env)


async def test_clear_errors_for_wrong_ca_wrong_password_and_missing_client_certificate(secure_etcd: SecureEtcd, tmp_path: Path) -> None:
    ok = await asyncio.to_thread(_diff, tmp_path, secure_etcd)
    assert ok.returncode in (0, 2), ok.stderr
    wrong_ca = await asyncio.to_thread(_diff, tmp_path, secure_etcd, ca_file=str(secure_etcd.pki / "other-ca.pem"))
    assert wrong_ca.returncode == 1 and "TLS verification of etcd's certificate failed" in wrong_ca.stderr, wrong_ca.stderr
    no_cert = await asyncio.to_thread(_diff, tmp_path, secure_etcd, cert_file=None, key_file=None)
    assert no_cert.returncode == 1 and "client certificate missing" in no_cert.stderr, no_cert.stderr
    wrong_pw = await asyncio.to_thread(_diff, tmp_path, secure_etcd, password_env="not-the-password")
    assert wrong_pw.returncode == 1 and "authentication failed for user 'root'" in wrong_pw.stderr, wrong_pw.stderr
    for result in (ok, wrong_ca, no_cert, wrong_pw):
        assert PASSWORD not in result.stderr + result.stdout and "not-the-password" not in result.stderr


async def test_push_and_control_apis_serve_https_on_separate_addresses(secure_etcd: SecureEtcd, tmp_path: Path) -> None:
    """The server certificate of the test PKI (for 127.0.0.1) serves both APIs over TLS."""
    s = settings(secure_etcd)
    pem, key = secure_etcd.pki / "good-server.pem", secure_etcd.pki / "good-server.key"
    s.api.listen, s.control.listen = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    s.api.token = SecretStr("https-token")
    s.api.tls_cert_file = s.control.tls_cert_file = pem
    s.api.tls_key_file = s.control.tls_key_file = key
    s.leader.enabled = False
    daemon = Daemon(s)
    await daemon.start()
    context = ssl.create_default_context(cafile=str(secure_etcd.pki / "good-ca.pem"))
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://{s.control.listen}/healthz", ssl=context) as resp:
                assert resp.status == 200
            async with http.get(f"https://{s.api.listen}/v2/ingress", ssl=context, headers={"Authorization": "Bearer https-token"}) as resp:
                assert resp.status in (200, 503)
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"http://{s.api.listen}/v2/ingress"):
                    pass
    finally:
        await daemon.stop()
