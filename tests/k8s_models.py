"""Kubernetes objects checked against the API's schemas without a cluster, through the official Python
client's typed models (``kubernetes.client``, generated from the API's OpenAPI spec).

``ApiClient.deserialize`` drops fields it does not know; here an unknown field, a value of the wrong
type, or a missing required field is an error naming its path (``spec.template.spec.containers[0].imagePulPolicy``),
the way the API server's strict field validation answers. What the models cannot check: values
(a bad enum string, a bad quantity), cross-object references, and custom resources (none used).
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime

import kubernetes.client as k8s

PRIMITIVES = {"str": str, "int": int, "float": (int, float), "bool": bool}


class SchemaError(Exception):
    pass


def model_for(api_version: str, kind: str) -> type:
    """``apps/v1`` + ``DaemonSet`` -> ``V1DaemonSet``; ``admissionregistration.k8s.io/v1`` -> ``V1…``."""
    version = api_version.rsplit("/", 1)[-1]
    name = version[0].upper() + version[1:] + kind
    cls = getattr(k8s, name, None)
    if cls is None:
        raise SchemaError(f"{api_version} {kind}: no such kind in the Kubernetes API")
    return cls


def load(obj: dict) -> object:
    """The typed model of one manifest object (a dict with apiVersion and kind)."""
    if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
        raise SchemaError("a manifest object needs apiVersion and kind")
    cls = model_for(obj["apiVersion"], obj["kind"])
    return _build(obj, cls.__name__, obj["kind"])


def _build(value: object, type_name: str, path: str) -> object:
    if value is None:
        return None
    if type_name in PRIMITIVES:
        ok = isinstance(value, PRIMITIVES[type_name]) and not (
            type_name != "bool" and isinstance(value, bool)
        )
        if not ok:
            raise SchemaError(f"{path}: {value!r} is not {type_name}")
        return value
    if type_name == "object":  # IntOrString, RawExtension: any JSON value
        return value
    if type_name in ("bytes", "bytearray"):  # JSON carries bytes as base64 (caBundle): 37 on types them
        try:
            return base64.b64decode(value if isinstance(value, str) else b"!", validate=True)
        except binascii.Error:
            raise SchemaError(f"{path}: {value!r} is not base64") from None
    if type_name == "datetime":
        if not isinstance(value, str):
            raise SchemaError(f"{path}: {value!r} is not a timestamp")
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    # the client spells containers list[X] / dict(str, X) (up to 36) or List[X] / Dict[str, X] (37 on)
    if m := re.fullmatch(r"[lL]ist\[(.+)\]", type_name):
        if not isinstance(value, list):
            raise SchemaError(f"{path}: expected a list, got {type(value).__name__}")
        return [_build(v, m.group(1), f"{path}[{i}]") for i, v in enumerate(value)]
    if m := re.fullmatch(r"[dD]ict[(\[]str, (.+)[)\]]", type_name):
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected a map, got {type(value).__name__}")
        return {k: _build(v, m.group(1), f"{path}.{k}") for k, v in value.items()}
    cls = getattr(k8s, type_name)
    if not isinstance(value, dict):
        raise SchemaError(f"{path}: expected an object ({type_name}), got {type(value).__name__}")
    by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    kwargs = {}
    for key, v in value.items():
        if key not in by_json:
            raise SchemaError(f"{path}: unknown field {key!r} (not in {type_name})")
        attr = by_json[key]
        kwargs[attr] = _build(v, cls.openapi_types[attr], f"{path}.{key}")
    try:
        return cls(**kwargs)  # the model refuses a missing required field
    except ValueError as exc:
        raise SchemaError(f"{path}: {exc}") from None
