"""The published push API contract (docs/openapi.yaml), generated from the request models.

`schemas` turns the pydantic models into component schemas (the rules JSON Schema can say, the
others named in descriptions); `spec` merges them into the hand-written part of the document
(`../openapi_base.yaml`: prose, callbacks, errors), adds the links a stateful client follows and,
given a sidecar's settings, specializes it to that sidecar.
"""

from .spec import openapi_spec, openapi_yaml

__all__ = ["openapi_spec", "openapi_yaml"]
