"""NCCL forwarded at its API under `gpuattach run --spread`: NCCL runs in each rank's worker, and the
workers' NCCL connects worker to worker, not through the clients.

Two real gpupool-servers (simulated GPUs, lease workers on the host executor); each worker's NCCL is a
stand-in library (tests/nccl_standin/standin_nccl.c, built here) doing the calls over TCP between the
ranks' processes, as NCCL's socket transport does, and logging which process made each connection. The
ranks are tests/nccl_rank.py (ctypes: the shim for CUDA, the preloaded libgpupool_nccl.so for NCCL).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pool_harness import ROOT, ServerProc, env_for, gpuattach

from virtualize.client.remote import nccl_env
from virtualize.common._calls import CALL_IDS, INTERNAL

pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(
        importlib.util.find_spec("virtualize.client._libgpupool_nccl") is None
        or importlib.util.find_spec("virtualize.client._libcuda_shim") is None,
        reason="the shim or libgpupool_nccl.so is not built",
    ),
]


def _installed_nccl() -> Path | None:
    """The nvidia-nccl package's libnccl.so.2 (what PyTorch's CUDA wheels install), if here."""
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") else None
    found = [
        Path(p) / "lib" / "libnccl.so.2" for p in ((spec.submodule_search_locations or []) if spec else [])
    ]
    return next((path for path in found if path.is_file()), None)


INSTALLED_NCCL = _installed_nccl()
# Starts both ranks at once, as torchrun does, and reports each one's lines.
LAUNCHER = """
import json, os, subprocess, sys
ranks = [subprocess.Popen([sys.executable, "tests/nccl_rank.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, "LOCAL_RANK": str(r)}) for r in (0, 1)]
for r, p in enumerate(ranks):
    out, err = p.communicate(timeout=90)
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    print(json.dumps({"rank": r, "rc": p.returncode, "out": lines, "err": err[-1500:]}), flush=True)
"""


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the stand-in NCCL"
    out = tmp_path_factory.mktemp("standin") / "libstandin_nccl.so"
    source = ROOT / "tests" / "nccl_standin" / "standin_nccl.c"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-fvisibility=hidden", "-o", str(out), str(source)], check=True,
                   timeout=120)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def servers(tmp_path_factory, standin):
    base = tmp_path_factory.mktemp("ncclspread")
    log = base / "standin.log"
    env = {
        "GPUPOOL_WORKER_EXECUTOR": "host",
        "GPUPOOL_WORKER_NCCL_LIBRARY": str(standin),
        "GPUPOOL_STANDIN_NCCL_LOG": str(log),
    }
    procs = [ServerProc(base / f"s{i}", "1xH100-80GB", env=env).start() for i in range(2)]
    yield procs, log
    for s in procs:
        s.stop()


def test_spread_ranks_run_nccl_in_their_workers_which_connect_to_each_other(servers, tmp_path):
    """Under `gpuattach run -n 2 --spread` each rank's NCCL calls run in its lease's worker: all-reduce and
    broadcast give the right values, the collective's bytes travel over a connection between the two
    workers (the stand-in logs no client process), another lease's communicator is refused (by the client
    library and by the worker), a collective on memory that is not the lease's is refused with the
    communicator's asynchronous error, a name that is not forwarded returns ncclInvalidUsage, and a destroyed
    communicator is refused."""
    procs, log = servers
    env, _ = env_for(tmp_path, procs, "ncclranks")
    meet = tmp_path / "meet"
    meet.mkdir()
    env.update(NCCL_TEST_DIR=str(meet), NCCL_TEST_QUERY_CALL=str(CALL_IDS[INTERNAL["gpNcclCommQuery"]]))
    out = gpuattach("run", "-n", "2", "-m", "1024", "--spread", "--", sys.executable, "-c", LAUNCHER, env=env,
                    timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    ranks = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["rc"] for r in ranks] == [0, 0], ranks
    for r in ranks:
        assert r["out"]["count"] == "2", r
        assert r["out"]["allreduce"] == "3.0", r  # 1 + 2 on every element, on both ranks
        assert r["out"]["broadcast"] == "ok", r
        assert r["out"]["async_error"] == "0", r
        assert r["out"]["after_destroy"] == "4", r  # ncclInvalidArgument: the communicator is gone
    first = ranks[0]["out"]
    assert first["foreign_allreduce"] == "4", first  # refused by this process's library
    assert first["foreign_query"] == "0 4", first  # the worker answers, and refuses it: not this lease's
    assert first["unforwarded"] == "5", first  # ncclInvalidUsage
    assert first["stray_buffer"] == "0 4", first  # enqueued, then refused: ncclInvalidArgument, kept
    assert "ncclCommShrink" in ranks[0]["err"]

    # Who talked to whom: every stand-in event happened in a worker process, never in a rank's.
    events = [
        dict(re.findall(r"(\w+)=(\S+)", line), what=line.split()[0]) for line in log.read_text().splitlines()
    ]
    client_pids = {r["out"]["pid"] for r in ranks}
    assert events and all(e["pid"] not in client_pids for e in events), events
    assert all("virtualize.server.worker" in line for line in log.read_text().splitlines())
    accepted = [e for e in events if e["what"] == "accepted"]
    connected = [e for e in events if e["what"] == "connected"]
    assert len(accepted) == 1 and len(connected) == 1, events
    assert accepted[0]["pid"] != connected[0]["pid"]  # two workers, one each side
    assert accepted[0]["peer"] == connected[0]["local"]  # one connection, worker to worker
    reduced = [e for e in events if e["what"] == "allreduce"]
    assert {e["pid"] for e in reduced} == {accepted[0]["pid"], connected[0]["pid"]}, events


# Both ranks exit without destroying their communicator; the launcher then waits (the leases still held)
# until the stand-in has logged what the workers did with them.
LEAVING_LAUNCHER = (
    LAUNCHER
    + """
import time
deadline = time.monotonic() + 30
while time.monotonic() < deadline and open(os.environ["STANDIN_LOG"]).read().count("aborted") < 2:
    time.sleep(0.1)
"""
)


def test_a_rank_that_exits_holding_a_communicator_has_it_aborted_by_its_worker(servers, tmp_path):
    """A rank process that ends without ncclCommDestroy (a crash, an exit) does not leave its communicator
    behind in the worker: the worker aborts it when the process's connection ends, as the process's end
    does natively."""
    procs, log = servers
    env, _ = env_for(tmp_path, procs, "nccleave")
    meet = tmp_path / "meet"
    meet.mkdir()
    start = log.stat().st_size if log.exists() else 0
    env.update(NCCL_TEST_DIR=str(meet), NCCL_TEST_QUERY_CALL=str(CALL_IDS[INTERNAL["gpNcclCommQuery"]]),
               NCCL_TEST_LEAVE="1", STANDIN_LOG=str(log))  # fmt: skip
    out = gpuattach("run", "-n", "2", "-m", "1024", "--spread", "--", sys.executable, "-c", LEAVING_LAUNCHER,
                    env=env, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    ranks = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["rc"] for r in ranks] == [0, 0] and all(r["out"]["left"] == "1" for r in ranks), ranks
    aborted = [line for line in log.read_text()[start:].splitlines() if line.startswith("aborted")]
    assert len(aborted) == 2 and all("virtualize.server.worker" in line for line in aborted), aborted


@pytest.mark.parametrize("isolate", [False, True], ids=["one-worker", "isolate"])
def test_two_ranks_of_one_worker_each_block_only_their_own_connection_in_nccl_init(
    standin, tmp_path, isolate
):
    """GPUPOOL_NCCL=forward on a one-server lease of two GPUs: both ranks' NCCL runs in the one worker, where
    rank 0's blocking ncclCommInitRank holds only its own connection while rank 1's connection goes on to
    join it (a worker that ran one connection's call at a time would hang here), and the collectives agree.
    Under --isolate each rank's NCCL runs in its own process worker, and the two connect to each other."""
    log = tmp_path / "standin.log"
    server = ServerProc(tmp_path / "s", "2xH100-80GB", env={"GPUPOOL_WORKER_EXECUTOR": "host",
                        "GPUPOOL_WORKER_NCCL_LIBRARY": str(standin), "GPUPOOL_STANDIN_NCCL_LOG": str(log)})  # fmt: skip
    server.start()
    try:
        env, _ = env_for(tmp_path, [server], "nccltwo")
        meet = tmp_path / "meet"
        meet.mkdir()
        env.update(GPUPOOL_NCCL="forward", NCCL_TEST_DIR=str(meet),
                   NCCL_TEST_QUERY_CALL=str(CALL_IDS[INTERNAL["gpNcclCommQuery"]]))  # fmt: skip
        out = gpuattach(
            "run", *(["--isolate"] if isolate else []), "-n", "2", "-m", "1024", "--", sys.executable, "-c",
            LAUNCHER, env=env, timeout=120,
        )  # fmt: skip
    finally:
        server.stop()
    assert out.returncode == 0, out.stderr
    ranks = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["rc"] for r in ranks] == [0, 0], ranks
    assert all(r["out"]["allreduce"] == "3.0" and r["out"]["broadcast"] == "ok" for r in ranks), ranks
    events = [
        dict(re.findall(r"(\w+)=(\S+)", line), what=line.split()[0]) for line in log.read_text().splitlines()
    ]
    joined = [e for e in events if e["what"] in ("accepted", "connected")]
    assert len(joined) == 2 and len({e["pid"] for e in joined}) == (2 if isolate else 1), (
        events
    )  # the workers


def test_a_bad_gpupool_nccl_value_fails_the_run_in_one_line(servers, tmp_path):
    """GPUPOOL_NCCL takes forward or off: another value stops gpuattach with one line and no traceback,
    and the leases are given back."""
    procs, _ = servers
    env, _ = env_for(tmp_path, procs, "ncclbad")
    env["GPUPOOL_NCCL"] = "sometimes"
    out = gpuattach("run", "-n", "2", "-m", "1024", "--spread", "--", sys.executable, "-c", "print('ran')", env=env,
                    timeout=60)  # fmt: skip
    assert out.returncode != 0
    assert "ran" not in out.stdout
    assert "Traceback" not in out.stderr and "GPUPOOL_NCCL" in out.stderr


def test_the_forwarding_library_defines_every_name_the_installed_nccl_exports():
    """A program never reaches a libnccl of the client past libgpupool_nccl.so: every name the installed NCCL
    (the nvidia-nccl package PyTorch's wheels bring) exports is defined by the built library too."""
    real = INSTALLED_NCCL
    if real is None:
        pytest.skip("no nvidia-nccl package here to compare with")
    ours = Path(importlib.util.find_spec("virtualize.client._libgpupool_nccl").origin)
    assert _nccl_names(real) - _nccl_names(ours) == set()


def _nccl_names(library: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True,
                         timeout=60).stdout  # fmt: skip
    return {line.split()[-1] for line in out.splitlines() if re.match(r"p?nccl", line.split()[-1])}


@pytest.mark.parametrize(
    ("value", "spread", "preloaded"),
    [
        ("", True, True),
        ("", False, False),
        ("off", True, False),
        ("forward", False, True),
        ("FORWARD", True, True),
    ],
)
def test_gpupool_nccl_decides_whether_nccl_is_forwarded(tmp_path, value, spread, preloaded):
    """NCCL goes to the workers in --spread runs unless GPUPOOL_NCCL=off, and elsewhere only with
    GPUPOOL_NCCL=forward; what the program preloaded already stays preloaded after it."""
    library = tmp_path / "libgpupool_nccl.so"
    env = nccl_env({"GPUPOOL_NCCL": value, "LD_PRELOAD": "/opt/other.so"}, spread=spread, library=library)
    assert (env.get("LD_PRELOAD", "").split() == [str(library), "/opt/other.so"]) is preloaded
    assert ("LD_PRELOAD" in env) is preloaded


def test_a_server_without_nccl_answers_each_nccl_call_with_a_system_error(tmp_path):
    """A worker whose server has no NCCL library refuses the program's NCCL calls (ncclSystemError) and the
    run goes on: no crash, the program's CUDA still works (GPUPOOL_NCCL=forward on a one-GPU run here)."""
    server = ServerProc(tmp_path / "s", "1xH100-80GB", env={
        "GPUPOOL_WORKER_EXECUTOR": "host", "GPUPOOL_WORKER_NCCL_LIBRARY": str(tmp_path / "no" / "libnccl.so.2")})  # fmt: skip
    server.start()
    try:
        env, _ = env_for(tmp_path, [server], "ncclnone")
        env["GPUPOOL_NCCL"] = "forward"
        program = (
            "import ctypes; cuda = ctypes.CDLL('libcuda.so.1'); v = ctypes.c_int(); n = ctypes.c_int()\n"
            "print('nccl', ctypes.CDLL(None).ncclGetVersion(ctypes.byref(v)))\n"
            "print('cuda', cuda.cuInit(0), cuda.cuDeviceGetCount(ctypes.byref(n)), n.value)\n"
        )
        out = gpuattach(
            "run", "-n", "1", "-m", "512", "--", sys.executable, "-c", program, env=env, timeout=60
        )
    finally:
        server.stop()
    assert out.returncode == 0, out.stderr
    assert "nccl 2" in out.stdout  # ncclSystemError
    assert "cuda 0 0 1" in out.stdout
    assert "Traceback" not in out.stderr
    log = server.log.read_text()
    assert "cannot load the server's NCCL" in log and "Traceback" not in log  # one line for the operator


# Asks the server's NCCL for a unique id and says which process listens on the address it names.
BOOTSTRAP_PROGRAM = """
import ctypes, os, socket, struct, psutil
nccl = ctypes.CDLL(None)
uid = ctypes.create_string_buffer(128)
print("rc", nccl.ncclGetUniqueId(uid))
family, port = struct.unpack_from("<H", uid.raw, 8)[0], struct.unpack_from(">H", uid.raw, 10)[0]
host = socket.inet_ntoa(uid.raw[12:16])
listeners = [c.pid for c in psutil.net_connections(kind="tcp") if c.status == "LISTEN" and c.laddr.port == port]
print("root", family, host, port, os.getpid(), *listeners)
print("cmd", " ".join(psutil.Process(listeners[0]).cmdline()) if listeners else "-")
"""


@pytest.mark.skipif(INSTALLED_NCCL is None, reason="no nvidia-nccl package here")
def test_the_real_nccl_bootstrap_root_listens_in_the_worker_not_in_the_program(tmp_path):
    """With the server's real NCCL (the nvidia-nccl package; no GPU needed for this call), ncclGetUniqueId
    runs in the lease's worker: the address the unique id names is a socket the worker listens on, on the
    server, so the other ranks' workers connect there and not to the program."""
    server = ServerProc(tmp_path / "s", "1xH100-80GB", env={"GPUPOOL_WORKER_EXECUTOR": "host",
                                                             "NCCL_SOCKET_IFNAME": "lo"})  # fmt: skip
    server.start()
    try:
        env, _ = env_for(tmp_path, [server], "ncclroot")
        env["GPUPOOL_NCCL"] = "forward"
        out = gpuattach("run", "-n", "1", "-m", "512", "--", sys.executable, "-c", BOOTSTRAP_PROGRAM, env=env,
                        timeout=60)  # fmt: skip
    finally:
        server.stop()
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines["rc"] == "0", out.stdout + out.stderr
    family, host, port, program, *listeners = lines["root"].split()
    assert (family, host) == ("2", "127.0.0.1") and int(port) > 0  # AF_INET on the loopback NCCL was told
    assert listeners and program not in listeners, lines
    assert "virtualize.server.worker" in lines["cmd"], lines
