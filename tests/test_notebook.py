"""notebooks/audit.ipynb runs top to bottom against constructed telemetry (nbclient, a real kernel)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_analytics_data import GIB, gpu_rows, write_rows

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "audit.ipynb"


def _text(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            out.append(str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def test_audit_notebook_executes(tmp_path, monkeypatch):
    # Two GPUs for 10 minutes at 10 s: node-a/0 busy at 50 %, node-b/0 idle holding 4 GiB.
    rows = gpu_rows("node-a", 0, [0.5] * 60, tick_s=10, sm=[0.1] * 60, mem_used=8 * GIB)
    rows += gpu_rows("node-b", 0, [0.0] * 60, tick_s=10, mem_used=4 * GIB)
    write_rows(tmp_path / "telemetry", "gpu_samples", rows)
    monkeypatch.setenv("GPUPOOL_TELEMETRY", str(tmp_path / "telemetry"))

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()

    text = _text(nb)
    assert "2 GPUs on 2 hosts" in text
    assert "GPU-hours observed:   0.3" in text  # 2 x 60 x 10 s
    assert "utilization.gpu mean: 25.0%" in text
    assert "SM activity mean:     10.0%" in text
    assert "node-b GPU 0: held idle 100% of samples" in text
    assert "SIMULATED" not in text
    chart = nb.cells[-1].outputs[0]["data"]
    assert "application/vnd.plotly.v1+json" in chart
    traces = chart["application/vnd.plotly.v1+json"]["data"]
    assert [t["name"] for t in traces] == ["utilization.gpu", "SM activity"]
