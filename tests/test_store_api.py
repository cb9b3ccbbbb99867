"""Both stores keep the interface the pool calls (server._store_api): every method, same parameters.

A method removed or renamed in either implementation, or one the pool starts calling without declaring
it, fails here rather than in cluster mode on a live server.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from server._cluster import Cluster
from server._store import Store
from server._store_api import LeaseStore, SettingsStore, TokenStore

SERVER = Path(__file__).resolve().parent.parent / "server"

IMPLEMENTATIONS = [
    (TokenStore, Store),
    (TokenStore, Cluster),
    (SettingsStore, Store),
    (SettingsStore, Cluster),
    (LeaseStore, Store),
]


def _declared(protocol) -> list[str]:
    return sorted(n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_"))


def _parameters(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(("protocol", "impl"), IMPLEMENTATIONS, ids=lambda x: x.__name__)
def test_every_declared_method_is_implemented_with_the_same_parameters(protocol, impl):
    assert _declared(protocol), f"{protocol.__name__} declares nothing"
    for name in _declared(protocol):
        assert callable(getattr(impl, name, None)), f"{impl.__name__} lacks {protocol.__name__}.{name}"
        assert _parameters(getattr(impl, name)) == _parameters(getattr(protocol, name)), (
            f"{impl.__name__}.{name} takes other parameters than {protocol.__name__}.{name}"
        )


def test_instances_satisfy_the_runtime_checks(tmp_path):
    store = Store(tmp_path / "pool.sqlite")
    try:
        assert isinstance(store, TokenStore) and isinstance(store, SettingsStore)
        assert isinstance(store, LeaseStore)
    finally:
        store.close()
    cluster = Cluster("etcd://127.0.0.1:1", "test:1")  # connects on its first call only
    assert isinstance(cluster, TokenStore) and isinstance(cluster, SettingsStore)


def test_the_pool_calls_only_declared_methods():
    declared = {"store": LeaseStore, "tokens": TokenStore, "settings": SettingsStore}
    calls = set()
    for module, attr in (("_pool.py", r"self"), ("_app.py", r"st\.pool")):
        calls |= set(re.findall(attr + r"\.(store|tokens|settings)\.(\w+)", (SERVER / module).read_text()))
    assert {"store", "tokens", "settings"} <= {part for part, _ in calls}
    undeclared = sorted(f"{part}.{name}" for part, name in calls if name not in _declared(declared[part]))
    assert not undeclared, f"declare these in server/_store_api.py: {undeclared}"
