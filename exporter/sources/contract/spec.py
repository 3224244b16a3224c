"""The push API's OpenAPI document: the hand-written part (`openapi_base.yaml`) with the generated schemas.

Without settings it is the published contract (docs/openapi.yaml), where the rules that depend
on a sidecar's settings are named in descriptions. Given the settings and the installed checker
plugins it is that sidecar's own contract: the timeouts within its bounds, the plugin kinds it
has, `ca_file` under its directories, `?wait=served` only with `traefik.api_url`.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import yaml

from ...config.schema import Settings
from .schemas import Schema, model_schemas, protocol_schemas, ref

_REQUEST_ID = {
    "description": "the request's id: the coordinator's own when it is at most 128 of A-Za-z0-9._:-, else a generated one (32 hex)",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
}
_BODY_INGRESS = "$request.body#/ingresses/0"
_LISTED = "$response.body#/ingresses/0"
_LINKS = {
    "upsertIngresses": {"204": {
        "ListIngresses": {"operationId": "listIngresses", "parameters": {"authority": f"{_BODY_INGRESS}/authority"}},
        "RemoveIngress": {"operationId": "removeIngresses", "requestBody": {"ingresses": [
            {"authority": f"{_BODY_INGRESS}/authority", "id": f"{_BODY_INGRESS}/id", "revision": f"{_BODY_INGRESS}/revision"},
        ]}},
    }},
    "listIngresses": {"200": {
        "RemoveListed": {"operationId": "removeIngresses", "requestBody": {"ingresses": [
            {"authority": f"{_LISTED}/authority", "id": f"{_LISTED}/id", "revision": f"{_LISTED}/revision"},
        ]}},
    }},
}


def openapi_spec(settings: Settings | None = None, plugin_kinds: list[str] | None = None) -> dict[str, Any]:
    """The OpenAPI document; with `settings` (and the installed `plugin_kinds`), specialized to that sidecar."""
    spec: dict[str, Any] = yaml.safe_load(resources.files("exporter.sources").joinpath("openapi_base.yaml").read_text())
    schemas = protocol_schemas(model_schemas())
    stored = schemas["StoredIngress"]
    stored["required"] = [*stored["required"], "status"]
    spec["components"]["schemas"] = {**schemas, **spec["components"]["schemas"]}
    spec["components"]["headers"] = {"RequestId": _REQUEST_ID}
    for response in _responses(spec):
        response.setdefault("headers", {})["X-BackendAI-RequestID"] = {"$ref": "#/components/headers/RequestId"}
    for operation in _operations(spec):
        for status, links in _LINKS.get(operation["operationId"], {}).items():
            operation["responses"][status]["links"] = links
    if settings is not None:
        _specialize(spec, settings, plugin_kinds or [])
    return spec


def openapi_yaml(settings: Settings | None = None, plugin_kinds: list[str] | None = None) -> str:
    """The OpenAPI document as YAML (docs/openapi.yaml is this, without settings)."""
    return yaml.safe_dump(openapi_spec(settings, plugin_kinds), sort_keys=False, width=120, allow_unicode=True)


def _operations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for item in spec["paths"].values() for op in item.values()]


def _responses(spec: dict[str, Any]) -> list[dict[str, Any]]:
    inline = [r for op in _operations(spec) for r in op["responses"].values() if "$ref" not in r]
    return [*inline, *spec["components"]["responses"].values()]


def _specialize(spec: dict[str, Any], settings: Settings, plugin_kinds: list[str]) -> None:
    schemas: dict[str, Schema] = spec["components"]["schemas"]
    bounds = settings.upstream.timeouts_bounds
    for timeout in schemas["Timeouts"]["properties"].values():
        branch = timeout["anyOf"][0]
        branch.pop("exclusiveMinimum", None)
        branch.update(minimum=bounds.min, maximum=bounds.max)
    kinds = sorted(set(plugin_kinds))
    if kinds:
        schemas["PluginUpstream"]["properties"]["kind"] = {"enum": kinds, "description": "a kind of a checker plugin installed here"}
    else:
        schemas["HttpUpstream"]["oneOf"].remove(ref("PluginUpstream"))
        del schemas["PluginUpstream"]
    ca_file = schemas["UpstreamTls"]["properties"]["ca_file"]
    dirs = [re.escape(str(d).rstrip("/")) for d in settings.upstream.ca_file_dirs]
    if dirs:
        ca_file["anyOf"][0]["pattern"] = f"^({'|'.join(dirs)})(/[^/\\x00-\\x1f\\x7f]+)+$"
    else:
        schemas["UpstreamTls"]["properties"]["ca_file"] = {"type": "null", "description": "no upstream.ca_file_dirs here"}
    if settings.traefik.api_url is None:
        for operation in _operations(spec):
            operation["parameters"] = [p for p in operation.get("parameters", []) if p.get("$ref") != "#/components/parameters/Wait"]
            if not operation["parameters"]:
                del operation["parameters"]
