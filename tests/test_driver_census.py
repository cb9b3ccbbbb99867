"""The driver census (docs/driver-census.md) covers every entry point of cuda.h, is generated, and is true
of the built shim: what it calls forwarded resolves to the table's call, what it calls refused or not
forwarded yet answers CUDA_ERROR_NOT_SUPPORTED."""

from __future__ import annotations

import ctypes
import importlib.metadata
import re

import pytest

from virtualize.client.remote import shim_library_path
from virtualize.common import _census
from virtualize.common._calls import CALLS
from virtualize.common._census import CensusError, Group, Verdict

NOT_SUPPORTED = 801


@pytest.fixture(scope="module")
def header_text() -> str:
    return _census.header_path().read_text()


@pytest.fixture(scope="module")
def entries():
    return _census.take(_census.installed_header())


def test_every_entry_point_the_installed_header_declares_has_a_row_in_the_committed_census(header_text):
    """A cuda.h entry point (read here with a pattern of its own, not the generator's) missing from the
    committed census fails: the census is the whole driver API, not what our programs happened to call."""
    declared = set(re.findall(r"\bCUresult (cu\w+)\(", header_text))
    assert len(declared) > 400  # cuda.h's driver API, not an empty or truncated file
    rows = set(re.findall(r"^\| `(cu\w+)` \|", _census.CENSUS_OUTPUT.read_text(), re.MULTILINE))
    assert not declared - rows, f"missing from docs/driver-census.md: {sorted(declared - rows)}"


def test_the_committed_census_and_its_summary_in_remote_md_are_up_to_date():
    """Changing the call table, a group's reasons or the installed cuda-bindings without regenerating
    fails here (and `python -m virtualize.common._shimgen` fixes it)."""
    for path, text in _census.generated().items():
        assert path.read_text() == text, f"{path.name} is stale: run python -m virtualize.common._shimgen"


def test_a_new_entry_point_with_no_decision_stops_the_generator(header_text):
    """A name that is neither in the call table nor in a group gets no default verdict: the generator
    refuses to write the census and names it."""
    new = "cdef CUresult cuMadeUpNewCall(int x) except ?CUDA_ERROR_NOT_FOUND nogil\n"
    header = _census.parse_header(header_text + new, "a future cuda.h")
    with pytest.raises(CensusError, match="cuMadeUpNewCall is neither forwarded nor in a group"):
        _census.take(header)


def test_a_forwarded_call_whose_newest_abi_is_older_than_the_header_stops_the_generator(header_text):
    """cuda.h moving a name to a new ABI (more parameters) while the table forwards only the old one
    would make the shim serve the old signature: the census refuses to call that forwarded."""
    changed = header_text.replace(
        "cdef CUresult cuMemsetD8Async(", "cdef CUresult cuMemsetD8Async(int extra, "
    )
    with pytest.raises(CensusError, match="cuMemsetD8Async: the header's ABI has 5 parameters"):
        _census.take(_census.parse_header(changed, "a future cuda.h"))


def test_a_group_that_names_a_forwarded_or_an_undeclared_call_stops_the_generator(header_text):
    """A reason may not outlive the call it excuses: once a call is forwarded, or gone from cuda.h, its
    group entry must go too."""
    header = _census.parse_header(header_text, "cuda.h")
    stale = Group("stale", Verdict.NOT_YET, "", ("cuMemsetD8Async", "cuNoSuchCall"))
    with pytest.raises(CensusError) as raised:
        _census.take(header, groups=(*_census.GROUPS, stale))
    assert "cuMemsetD8Async is in the call table now" in str(raised.value)
    assert "names cuNoSuchCall, which the header does not declare" in str(raised.value)


def test_refused_groups_and_not_yet_groups_each_give_a_reason(entries):
    """Every name not forwarded carries its group, and every group says why in words."""
    for entry in entries:
        if entry.verdict in (Verdict.REFUSED, Verdict.NOT_YET):
            assert entry.group is not None and len(entry.group.why) > 40, entry.name


def _header_version() -> int:
    major, minor = importlib.metadata.version("cuda-bindings").split(".")[:2]
    return int(major) * 1000 + int(minor) * 10


@pytest.mark.needs("cc")
def test_the_built_shim_does_what_the_census_says(entries):
    """Through the built shim's cuGetProcAddress: each forwarded or in-the-client name, asked for at its
    ABI's version, resolves to the exported function of the ABI the census names; each refused or
    not-yet name, asked for at the header's version, resolves to a function that answers
    CUDA_ERROR_NOT_SUPPORTED (it needs no worker)."""
    shim = ctypes.CDLL(str(shim_library_path()))
    get_proc = shim.cuGetProcAddress_v2
    get_proc.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.c_void_p,
    ]
    header = _census.installed_header()
    aliases = {name: (since, target) for name, since, target in _census.ALIASES}
    by_symbol = {c.symbol: c for c in CALLS}

    def resolve(name: str, version: int) -> int:
        pfn = ctypes.c_void_p()
        assert get_proc(name.encode(), ctypes.byref(pfn), version, 0, None) == 0, name
        return pfn.value

    checked = 0
    for entry in entries:
        if entry.verdict in (Verdict.REFUSED, Verdict.NOT_YET):
            stub = ctypes.CFUNCTYPE(ctypes.c_int)(resolve(entry.name, _header_version()))
            assert stub() == NOT_SUPPORTED, entry.name
        elif entry.group is None and not re.search(r"_v\d+$", entry.name):  # a program asks by plain name
            call = _census.abi_call(header, entry.name, CALLS) or by_symbol[aliases[entry.name][1]]
            version = aliases[entry.name][0] if entry.name in aliases else call.since
            exported = ctypes.cast(getattr(shim, call.symbol), ctypes.c_void_p).value
            assert resolve(entry.name, version) == exported, f"{entry.name} does not resolve to {call.symbol}"
            checked += 1
    assert checked > 100


def _typedefs() -> tuple[str, int]:
    """cudaTypedefs.h and its CUDA version, from the nvidia-cuda-runtime wheel (the test extra installs it)."""
    cuda_h = _census.cuda_h_path()
    typedefs = cuda_h.parent / "cudaTypedefs.h" if cuda_h else None
    assert typedefs and typedefs.exists(), "no cudaTypedefs.h: install the test extra (nvidia-cuda-runtime)"
    version = re.search(r"#define CUDA_VERSION (\d+)", cuda_h.read_text())
    assert version, f"{cuda_h} names no CUDA_VERSION"
    return typedefs.read_text(), int(version.group(1))


def test_every_abi_version_of_the_call_table_is_one_the_headers_declare():
    """cuGetProcAddress answers by (name, version): an ABI filed under a version the driver does not know it
    by (cuLogsCurrent under 12080 where cudaTypedefs.h says 12090) makes the shim answer 'not found' at
    versions the driver serves. Every table ABI up to the header's CUDA must be a PFN_<name>_v<version>
    of cudaTypedefs.h; newer ones (the table follows newer cuda-bindings) are checked by the next header."""
    text, header_cuda = _typedefs()
    declared: dict[str, set[int]] = {}
    for name, version in re.findall(r"\bPFN_(cu\w+?)_v(\d+)\)", text):
        declared.setdefault(name, set()).add(int(version))
    assert len(declared) > 400  # the driver API's typedefs, not an empty or truncated file
    wrong = [
        f"{call.name}@{call.since} (header: {sorted(declared[call.name])})"
        for call in CALLS
        if call.name in declared and call.since <= header_cuda and call.since not in declared[call.name]
    ]
    assert not wrong, f"ABI versions cudaTypedefs.h does not declare: {wrong}"


def test_the_old_abis_served_as_forwarded_ones_are_those_cuda_h_declares_with_their_parameters():
    """LEGACY_ABIS is cuda.h's list, not ours: every old ABI the header declares (for the driver's own build)
    with the parameters of the versioned symbol its name now means, where that symbol is forwarded and the
    old one is not in the table already. A new CUDA that adds one, or a table entry the header does not
    back (an old ABI whose parameters differ would be called with the wrong arguments), fails here."""
    cuda_h = _census.cuda_h_path()
    assert cuda_h is not None, "no cuda.h: install the test extra (nvidia-cuda-runtime)"
    derived = _census.legacy_same_abis(cuda_h.read_text())
    assert ("cuMemAlloc", "cuMemAlloc_v2") not in derived.items()  # 32-bit pointers: the parameters differ
    symbols = {c.symbol for c in CALLS}
    expected = {old: new for old, new in derived.items() if new in symbols and old not in symbols}
    assert dict(_census.LEGACY_ABIS) == expected
