"""bench/framework_suites.py on suites of our own making, with real pytest processes: a part survives a
test that kills its process, counts as pytest's JUnit report does, splits into shards, and keeps what a
remote crash needs to be understood (the shim's trace, the worker's log)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from remote_helpers import needs_cc

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "framework_suites.py"

DEMO = """
import os
import pytest

def test_passes(): pass
def test_fails(): assert False, "wrong"
def test_aborts(): os.abort()
def test_after_the_abort(): pass
@pytest.mark.skip(reason="not here")
def test_skipped(): pass
@pytest.mark.xfail
def test_expected_to_fail(): assert False
@pytest.fixture
def broken(): raise RuntimeError("setup")
def test_setup_error(broken): pass
"""


def run(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--suites", str(tmp_path / "suites"),
                           "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def run_demo_remotely(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    """The demo part natively, then through a host-executor lease; it has to finish."""
    proc = run(tmp_path, "--part", "demo=demo/test_demo.py", "--executor", "host", *flags, "--timeout", "150",
               timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def suite(tmp_path: Path, source: str, name: str = "test_demo.py") -> None:
    (tmp_path / "suites" / "demo").mkdir(parents=True, exist_ok=True)
    (tmp_path / "suites" / "demo" / name).write_text(source)


def row(tmp_path: Path, part: str) -> dict:
    return next(r for r in json.loads((tmp_path / "out" / "suites.json").read_text()) if r["part"] == part)


def test_a_test_that_aborts_its_process_counts_as_crashed_and_the_rest_of_the_part_still_runs(tmp_path):
    suite(tmp_path, DEMO)
    proc = run(tmp_path, "--part", "demo=demo/test_demo.py", "--native-only", "--timeout", "100")
    assert proc.returncode == 0, proc.stderr[-2000:]
    native = row(tmp_path, "demo")["native"]
    # test_after_the_abort ran (in a fresh process) and passed; the aborted test is one more failure.
    assert (native["passed"], native["failed"], native["errors"], native["skipped"]) == (2, 2, 1, 2)
    assert native["crashes"] == 1 and native["ran"] == 7
    crash = (tmp_path / "out" / "demo.native.crash-1.txt").read_text()
    assert crash.startswith("test_demo.py::test_aborts:")
    assert "Fatal Python error: Aborted" in crash


def test_the_counts_are_those_of_pytests_junit_report(tmp_path):
    """Outside the crash, each test lands in the category pytest's JUnit XML gives it."""
    suite(tmp_path, DEMO)
    xml = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not test_aborts",
                    f"--junitxml={xml}", str(tmp_path / "suites" / "demo" / "test_demo.py")],
                   capture_output=True, timeout=120)  # fmt: skip
    junit = {"failure": 0, "error": 0, "skipped": 0, "passed": 0}
    for case in ET.parse(xml).iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        junit[kinds[0] if kinds else "passed"] += 1
    proc = run(tmp_path, "--part", "demo=demo/test_demo.py::not test_aborts", "--native-only")
    assert proc.returncode == 0, proc.stderr[-2000:]
    native = row(tmp_path, "demo")["native"]
    assert (native["passed"], native["failed"], native["errors"], native["skipped"]) == (
        junit["passed"], junit["failure"], junit["error"], junit["skipped"])  # fmt: skip


def test_shards_split_a_part_into_pieces_that_together_run_each_test_once(tmp_path):
    suite(tmp_path, "".join(f"def test_{n}(): pass\n" for n in range(7)))
    proc = run(tmp_path, "--native-only", *(f"--part=s{i}=demo/test_demo.py@{i}/3" for i in (1, 2, 3)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    ran = []
    for i in (1, 2, 3):
        progress = (tmp_path / "out" / f"s{i}.native.1.progress").read_text().splitlines()
        ran.append([json.loads(line)["end"] for line in progress if '"end"' in line])
    assert all(ran) and sorted(t for shard in ran for t in shard) == [
        f"test_demo.py::test_{n}" for n in range(7)
    ]


TORCH_SUITE_FILE = """
from torch.testing._internal.common_utils import serialTest

@serialTest
def test_bare_and_passing(): pass
@serialTest
def test_bare_and_failing(): assert False, "the body ran"
@serialTest()
def test_called(): pass
"""


def test_a_pytorch_test_file_from_an_older_release_collects_and_runs_its_tests_on_the_installed_one(tmp_path):
    """Older PyTorch test files write `@serialTest` bare, which newer PyTorch refuses at import: the whole file
    failed to collect (test_cuda.py on 2.11). Each test runs, its body included."""
    pytest.importorskip("expecttest")  # PyTorch's test helpers import it
    (tmp_path / "suites" / "torch" / "test").mkdir(parents=True)
    (tmp_path / "suites" / "torch" / "test" / "test_old.py").write_text(TORCH_SUITE_FILE)
    proc = run(tmp_path, "--part", "old=torch/test/test_old.py", "--native-only", "--timeout", "100")
    assert proc.returncode == 0, proc.stderr[-2000:]
    native = row(tmp_path, "old")["native"]
    assert (native["passed"], native["failed"], native["errors"]) == (2, 1, 0)


def test_a_bad_part_or_a_missing_suite_file_is_refused_in_one_line(tmp_path):
    suite(tmp_path, "def test_x(): pass\n")
    for args, says in (
        (["--only", "no-such-part"], "no part named no-such-part"),
        (["--part", "x=demo/not_there.py"], "demo/not_there.py"),
        (["--part", "x=demo/test_demo.py@4/3"], "I must be between 1 and N"),
        (["--remote-env", "NO_EQUALS_SIGN"], "is not NAME=VALUE"),
        ([], "none of the parts' files is in"),  # the default parts, none of them fetched
    ):
        proc = run(tmp_path, *args, "--native-only")
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@needs_cc
def test_a_remote_env_setting_reaches_the_remote_runs_only(tmp_path):
    """--remote-env NAME=VALUE (to compare a setting of the shim's or the worker's on the same tests) is in
    the remote run's environment and not in the native one's."""
    suite(tmp_path, "import os\ndef test_setting(): assert os.environ.get('DEMO_SETTING') == 'on'\n")
    proc = run(tmp_path, "--part", "demo=demo/test_demo.py", "--executor", "host", "--remote-env", "DEMO_SETTING=on",
               "--timeout", "100", timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    both = row(tmp_path, "demo")
    assert (both["native"]["passed"], both["native"]["failed"]) == (0, 1)
    assert (both["remote"]["passed"], both["remote"]["failed"]) == (1, 0)


@needs_cc
@pytest.mark.slow
def test_a_remote_crash_keeps_the_shims_trace_and_the_workers_log(tmp_path):
    """Remotely (the host executor: no GPU), the crash file holds the shim's last traced calls and the
    worker's lines; the log keeps the worker's lines but not the trace."""
    suite(tmp_path, "import ctypes, os\n"
                    "def test_first(): pass\n"
                    "def test_calls_the_driver_then_aborts():\n"
                    "    assert ctypes.CDLL('libcuda.so.1').cuInit(0) == 0\n"
                    "    os.abort()\n"
                    "def test_last(): pass\n")  # fmt: skip
    run_demo_remotely(tmp_path, "--trace")
    remote = row(tmp_path, "demo")["remote"]
    assert (remote["passed"], remote["failed"], remote["crashes"]) == (2, 1, 1)
    out = tmp_path / "out"
    crash = (out / "demo.remote.crash-1.txt").read_text()
    assert "gpupool: call cuInit" in crash and "Fatal Python error: Aborted" in crash
    assert "gpupool-worker[" in crash
    assert "gpupool: call" not in (out / "demo.remote.log").read_text()
    assert "connected" in (out / "demo.remote.worker.log").read_text()


def test_a_worker_that_dies_under_a_test_costs_that_test_only(tmp_path):
    """Remotely, a test that kills the lease's worker (as a crash of the worker would: CuPy's captured host
    functions once did) is counted crashed, and the tests after it run with a fresh worker instead of
    failing one by one on a lost connection."""
    suite(tmp_path, "import ctypes, os, signal\n"
                    "from pathlib import Path\n"
                    "def test_first(): assert ctypes.CDLL('libcuda.so.1').cuInit(0) == 0\n"
                    "def test_the_worker_dies():\n"
                    "    assert ctypes.CDLL('libcuda.so.1').cuInit(0) == 0\n"
                    "    me, parent = os.getpid(), os.getppid()  # remote_once: the worker is the command's sibling\n"
                    "    children = Path(f'/proc/{parent}/task/{parent}/children').read_text().split()\n"
                    "    for pid in map(int, children):\n"
                    "        if pid != me:\n"
                    "            os.kill(pid, signal.SIGKILL)\n"
                    "    import time; time.sleep(3)\n"
                    "def test_after(): assert ctypes.CDLL('libcuda.so.1').cuInit(0) == 0\n"
                    "def test_last(): assert ctypes.CDLL('libcuda.so.1').cuDeviceGetCount(ctypes.byref(ctypes.c_int())) == 0\n")  # fmt: skip
    proc = run(tmp_path, "--part", "demo=demo/test_demo.py", "--executor", "host", "--timeout", "150",
               timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    remote = row(tmp_path, "demo")["remote"]
    assert (remote["passed"], remote["failed"], remote["crashes"]) == (3, 1, 1), remote
    assert "the lease worker died" in (tmp_path / "out" / "demo.remote.crash-1.txt").read_text()


@pytest.mark.needs("git")
def test_fetch_suites_brings_pytorchs_test_files_with_the_test_modules_they_import(tmp_path):
    """bench/fetch_suites.sh against a local clone standing in for PyTorch's repository: the three test
    files, each module of test/ they import (directly, through another, or as a package), and nothing else."""
    repo = tmp_path / "pytorch"
    files = {
        "test/test_cuda.py": "import torch\nfrom helpers_a import x\n",
        "test/test_cuda_multigpu.py": "from test_cuda import y\n",
        "test/test_nn.py": "import nn.util as u\nfrom torch.testing._internal.common_nn import z\n",
        "test/test_modules.py": "from torch.testing._internal.common_modules import module_db\n",
        "test/helpers_a.py": "    import helpers_b  # inside a function\n",
        "test/helpers_b.py": "",
        "test/nn/__init__.py": "",
        "test/nn/util.py": "",
        "test/test_unrelated.py": "from helpers_c import q\n",
        "test/helpers_c.py": "",
    }
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "tests"], ["tag", "v9.9.9"]):
        subprocess.run([*git, *step], check=True, capture_output=True)
    env = {**os.environ, "TORCH_GIT": f"file://{repo}", "TORCH_TAG": "v9.9.9", "TORCH_SITE_WHEELS": ""}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "fetch_suites.sh"), str(tmp_path / "suites"), "torch"],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = {
        str(p.relative_to(tmp_path / "suites" / "torch"))
        for p in (tmp_path / "suites" / "torch").rglob("*.py")
    }
    assert got == set(files) - {"test/test_unrelated.py", "test/helpers_c.py"}
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert (tmp_path / "suites" / "torch" / "COMMIT").read_text().strip() == head
    refused = subprocess.run(["bash", str(ROOT / "bench" / "fetch_suites.sh"), str(tmp_path / "x"), "tensorflow"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert refused.returncode == 2 and "no suite named tensorflow" in refused.stderr


@needs_cc
@pytest.mark.slow
def test_a_native_run_cut_by_its_time_limit_decides_the_tests_the_remote_run_runs(tmp_path):
    """The part's size is what the native run got through in --timeout: the remote run (host executor)
    runs exactly those tests, not the whole file, so the two counts compare the same tests."""
    suite(tmp_path, "import time\n" + "".join(f"def test_{n:02d}(): time.sleep(0.25)\n" for n in range(80)))
    proc = run(tmp_path, "--part", "slow=demo/test_demo.py", "--executor", "host", "--timeout", "8",
               "--remote-timeout", "200", timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    part = row(tmp_path, "slow")
    assert part["native"]["exit"] == 124 and 0 < part["native"]["ran"] < 80
    out = tmp_path / "out"
    ended = {
        mode: sorted(json.loads(line)["end"] for line in (out / f"slow.{mode}.1.progress").read_text().splitlines()
                     if '"end"' in line)
        for mode in ("native", "remote")
    }  # fmt: skip
    assert ended["remote"] == ended["native"]


@needs_cc
def test_the_tests_that_run_slower_remotely_are_named_by_group_and_profile_shows_their_calls(tmp_path):
    """Where a remote run loses time is named: the tests both runs ran, then each group of tests (a test
    less its parameters) that took 1.5 times as long and at least 1 s more, and not the groups that did
    not. With --profile the remote log holds each test process's profile of its driver calls."""
    suite(tmp_path, "import ctypes, os, time, pytest\n"
                    "REMOTE = any(k.startswith('GPUPOOL_') for k in os.environ)\n"
                    "@pytest.mark.parametrize('n', range(3))\n"
                    "def test_lanczos(n):\n"
                    "    assert ctypes.CDLL('libcuda.so.1').cuInit(0) == 0\n"
                    "    time.sleep(0.6 if REMOTE else 0.05)\n"
                    "@pytest.mark.parametrize('n', range(3))\n"
                    "def test_norm(n): time.sleep(0.05)\n")  # fmt: skip
    proc = run_demo_remotely(tmp_path, "--profile")
    slow = row(tmp_path, "demo")["slower"]
    assert slow[0].startswith("the 6 tests both ran: native ")
    assert len(slow) == 2 and slow[1].startswith("test_demo.py::test_lanczos: 3 tests, native ")
    assert any(
        line.startswith("  time: test_demo.py::test_lanczos: 3 tests") for line in proc.stdout.splitlines()
    )
    log = (tmp_path / "out" / "demo.remote.log").read_text()
    assert "gpupool: profile of pid" in log and "cuInit" in log
    # the calls the part's processes spent most time in, summed over them: cuInit once per process
    calls = row(tmp_path, "demo")["calls"]
    assert any(line.startswith("cuInit: ") for line in calls), calls
    assert any(line.startswith("  calls: cuInit: ") for line in proc.stdout.splitlines())
