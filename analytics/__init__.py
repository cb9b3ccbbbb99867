"""Analytics over gpupool telemetry: plain functions over DuckDB, no UI code.

``reports`` and ``tui`` read telemetry only through this package. Every function takes a connection
from ``open_telemetry`` and a ``Scope`` (time range, hosts, GPUs) and returns a frozen dataclass
whose field names carry their units (``_hours``, ``_bytes``, ``_s``; utilizations are ratios 0-1)
and a ``simulated`` flag, so every page can say when the data is not real.

Analytics only reads: the collector writes every table (raw segments, rollups, retention:
``collector.rollups``) and owns the reader it shares with it (``open_telemetry``, re-exported here
from ``collector.reader``, and the sample weights of ``collector.weights``).
"""

from analytics import live as live  # the console's queries: latest sample, series, processes
from analytics._attribution import BY as ATTRIBUTION_KEYS
from analytics._attribution import Attribution, AttributionRow, attribution
from analytics._extent import data_extent
from analytics._patterns import (
    DAYS,
    FULL_COVERAGE,
    FleetPatterns,
    HourOfWeek,
    Period,
    Periods,
    Timeline,
    TimePoint,
    busiest_idlest,
    fleet_patterns,
    hour_of_week,
    utilization_timeline,
)
from analytics._pool import ClientActivity, JobUsage, PoolActivity, pool_activity, pool_usage_by_job
from analytics._rollup import rollups_built
from analytics._scope import Extent, GpuInfo, Scope
from analytics._summary import (
    COARSE_INTERVAL_S,
    Distribution,
    FleetSummary,
    GpuStat,
    HostSampling,
    SummaryOptions,
    fleet_summary,
)
from analytics._whatif import (
    DEFAULT_PRICE,
    DEMANDS,
    GRANULARITIES,
    MEMORY_HINT,
    POLICIES,
    PoolOptions,
    WhatIf,
    memory_source,
    what_if,
)
from collector.reader import (
    TelemetryError,
    damaged_segments,
    open_telemetry,
    telemetry_notes,
    unrolled_hosts,
)
from collector.weights import GAP_FACTOR

__all__ = [
    "ATTRIBUTION_KEYS",
    "COARSE_INTERVAL_S",
    "DAYS",
    "DEFAULT_PRICE",
    "DEMANDS",
    "FULL_COVERAGE",
    "GAP_FACTOR",
    "GRANULARITIES",
    "MEMORY_HINT",
    "POLICIES",
    "Attribution",
    "AttributionRow",
    "ClientActivity",
    "Distribution",
    "Extent",
    "FleetPatterns",
    "FleetSummary",
    "GpuInfo",
    "GpuStat",
    "HostSampling",
    "HourOfWeek",
    "JobUsage",
    "Period",
    "Periods",
    "PoolActivity",
    "PoolOptions",
    "Scope",
    "SummaryOptions",
    "TelemetryError",
    "TimePoint",
    "Timeline",
    "WhatIf",
    "attribution",
    "busiest_idlest",
    "damaged_segments",
    "data_extent",
    "fleet_patterns",
    "fleet_summary",
    "hour_of_week",
    "memory_source",
    "open_telemetry",
    "pool_activity",
    "pool_usage_by_job",
    "rollups_built",
    "telemetry_notes",
    "unrolled_hosts",
    "utilization_timeline",
    "what_if",
]
