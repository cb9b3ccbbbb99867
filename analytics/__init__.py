"""Analytics over gpupool telemetry: plain functions over DuckDB, no UI code.

``reports`` and ``tui`` read telemetry only through this package.
"""

from analytics import live as live  # the console's queries: latest sample, series, processes
from analytics._telemetry import TelemetryError, open_telemetry

__all__ = ["TelemetryError", "open_telemetry"]
