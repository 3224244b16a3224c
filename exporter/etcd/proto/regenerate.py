"""Regenerate the etcd v3 message modules of this package from etcd's published protobuf files.

    git clone --branch v3.5.17 --depth 1 https://github.com/etcd-io/etcd /tmp/etcd
    pip install 'grpcio-tools>=1.60'
    python -m exporter.etcd.proto.regenerate /tmp/etcd

It copies `api/etcdserverpb/rpc.proto`, `api/mvccpb/kv.proto` and `api/authpb/auth.proto` here
without what only Go needs (gogoproto options, the gateway's HTTP annotations), with imports
rewritten to this package's path, then runs protoc for the messages and their type stubs. The
services are not generated: `exporter.etcd.grpc` calls each method by its path.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE_ROOT = HERE.parents[2]  # the directory holding `exporter/`
SOURCES = {"rpc.proto": "api/etcdserverpb/rpc.proto", "kv.proto": "api/mvccpb/kv.proto", "auth.proto": "api/authpb/auth.proto"}
PROTO_PATH = "exporter/etcd/proto"


def stripped(text: str) -> str:
    """The proto without Go-only imports and options, its imports pointing into this package."""
    text = re.sub(r'^import "(gogoproto/gogo|google/api/annotations)\.proto";\n', "", text, flags=re.M)
    text = re.sub(r"^option \(gogoproto\.[a-z_]+\) = [a-z]+;\n", "", text, flags=re.M)
    text = re.sub(r"\s*option \(google\.api\.http\) = \{.*?\};", "", text, flags=re.S)
    return re.sub(r'import "etcd/api/(?:mvccpb|authpb)/(\w+\.proto)";', rf'import "{PROTO_PATH}/\1";', text)


def main(etcd_source: str) -> int:
    """Copy, strip and compile; returns protoc's exit status."""
    for name, source in SOURCES.items():
        original = (Path(etcd_source) / source).read_text()
        header = f"// From etcd v3.5's {source}; regenerate with exporter/etcd/proto/regenerate.py.\n"
        (HERE / name).write_text(header + stripped(original))
    protos = [f"{PROTO_PATH}/{name}" for name in SOURCES]
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PACKAGE_ROOT}", f"--python_out={PACKAGE_ROOT}",
               f"--pyi_out={PACKAGE_ROOT}", *protos]
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
