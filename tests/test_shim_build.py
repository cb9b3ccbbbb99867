"""The shim's generated C matches the call table, and the package's install built the shim."""

from __future__ import annotations

import ctypes

import pytest

from virtualize.client.remote import remote_env, shim_dir, shim_library_path
from virtualize.common import _shimgen
from virtualize.common._calls import CALLS, Mode


def test_generated_c_is_up_to_date():
    for path, text in _shimgen.generated().items():
        assert path.read_text() == text, f"{path.name} is stale: run python -m virtualize.common._shimgen"


def test_every_call_has_one_abi_per_version():
    seen = {(c.name, c.since) for c in CALLS}
    assert len(seen) == len(CALLS)
    assert all(c.mode is not Mode.LOCAL or c.custom for c in CALLS)


@pytest.mark.needs("cc")
def test_the_install_built_a_loadable_shim_exporting_every_forwarded_call(tmp_path):
    library = ctypes.CDLL(str(shim_library_path()))
    for call in CALLS:
        if call.symbol != "-":
            assert hasattr(library, call.symbol), call.symbol
    assert hasattr(library, "cuGetProcAddress_v2")


@pytest.mark.needs("cc")
def test_remote_env_puts_the_shim_first(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/lib/elsewhere")
    env = remote_env(
        {"id": "L1", "worker": {"host": "10.0.0.5", "port": 4100, "secret": "s3"}}, cache_root=tmp_path
    )
    first = env["LD_LIBRARY_PATH"].split(":")[0]
    assert env["LD_LIBRARY_PATH"].endswith(":/usr/lib/elsewhere")
    assert (tmp_path / "gpupool").exists() and first.startswith(str(tmp_path))
    assert ctypes.CDLL(f"{first}/libcuda.so.1")  # the link resolves to the built shim
    assert env["GPUPOOL_WORKER"] == "10.0.0.5:4100"
    assert env["GPUPOOL_SECRET"] == "s3"
    assert env["GPUPOOL_LEASE"] == "L1"
    assert shim_dir(tmp_path) == shim_dir(tmp_path)  # idempotent


def test_a_lease_without_a_worker_is_a_clear_error():
    with pytest.raises(ValueError, match="remote=true"):
        remote_env({"id": "L2"})


def test_without_a_built_shim_the_error_says_how_to_get_one(monkeypatch):
    import importlib.util

    from virtualize.client.remote import ShimNotBuilt

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ShimNotBuilt, match="reinstall with a C compiler"):
        shim_library_path()


@pytest.mark.needs("cc")
def test_runs_share_one_compile_of_the_shim_until_a_source_changes(tmp_path, monkeypatch):
    """fresh_shim (each suites run, benchmark, remote_once) compiles the sources once per user and reuses
    that build while they are unchanged; a changed source file is what the next run gets."""
    from virtualize.client import remote

    sources = tmp_path / "client" / "shim"
    sources.mkdir(parents=True)
    source = '__attribute__((visibility("default"))) int gp_version(void) {{ return {}; }}\n'
    (sources / "version.c").write_text(source.format(1))
    monkeypatch.setattr(remote, "SHIM_SOURCES", sources)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def version(run: str) -> int:
        return ctypes.CDLL(str(remote.fresh_shim(tmp_path / run))).gp_version()

    assert version("run1") == 1
    built = list((tmp_path / "cache" / "gpupool").glob("built-shim-*"))
    assert len(built) == 1
    assert version("run2") == 1 and list((tmp_path / "cache" / "gpupool").glob("built-shim-*")) == built
    (sources / "version.c").write_text(source.format(2))
    assert version("run3") == 2
