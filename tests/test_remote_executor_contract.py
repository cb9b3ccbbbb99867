"""The executor contract follows the call table: every forwarded call has a handler in the lease guard
and a method in both executors (the CUDA one and the host-memory one), with the table's arguments."""

from __future__ import annotations

import inspect

import pytest

from virtualize.common._calls import CALLS, Mode
from virtualize.server._executor import GUARD_CALLS, PER_CALL, SHAPED, Executor, executor_method
from virtualize.server._executor_guard import LeaseState, Session
from virtualize.server._executor_host import HostExecutor

FORWARDED = [c for c in CALLS if executor_method(c) is not None]


def _executors():
    cuda = pytest.importorskip("virtualize.server._cuda", reason="cuda-bindings is not installed")
    return [HostExecutor, cuda.CudaExecutor]


def test_the_table_forwards_calls_and_serves_the_rest_in_the_client():
    assert len(FORWARDED) > 60
    assert {c.name for c in CALLS if c.mode is Mode.LOCAL} >= {"cuMemcpy", "cuLaunchKernel", "cuMemAllocHost"}


def test_the_guard_has_a_handler_for_every_forwarded_call_and_none_for_the_others():
    session = Session(LeaseState([1 << 20]), executor=None, channel=None)
    for call, handler in zip(CALLS, session.handlers, strict=True):
        # the guard's own, by name: not an ABI of that name served in the client (cuLaunchHostFunc_v2)
        served = executor_method(call) is not None or (
            call.name in GUARD_CALLS and call.mode is not Mode.LOCAL
        )
        assert (handler is not None) == served, call.name


@pytest.mark.parametrize("name", ["HostExecutor", "CudaExecutor"])
def test_both_executors_answer_every_forwarded_call(name):
    cls = next(e for e in _executors() if e.__name__ == name)
    assert not cls.__abstractmethods__, f"{name} lacks {sorted(cls.__abstractmethods__)}"
    for method in {*PER_CALL, *SHAPED.values()}:
        assert callable(getattr(cls, method)), method
    # Calls the guard passes straight through get the table's in-parameters, then any name or image.
    plain = Session(LeaseState([1 << 20]), executor=None, channel=None)
    for call, handler in zip(CALLS, plain.handlers, strict=True):
        if handler is None or getattr(handler, "__func__", None) is not Session._plain:
            continue
        n = len(call.ins) + sum(p.type in ("cstr", "bytes") for p in call.wire_params if not p.out)
        try:
            inspect.signature(getattr(cls, call.name)).bind(None, *range(n))
        except TypeError as exc:
            pytest.fail(f"{name}.{call.name} does not take the table's {n} arguments: {exc}")


def test_an_executor_missing_a_forwarded_call_cannot_be_created():
    incomplete = type("Incomplete", (Executor,), {})
    with pytest.raises(TypeError, match=PER_CALL[0]):
        incomplete()
