"""The telemetry schema: every table gpupool writes, declared once as data.

Everything that writes telemetry (the collector's sources, the importers, the pool server) and
everything that reads it (analytics) goes through these declarations, so a column has one name, one
type and one unit. Values are stored in base units: bytes, watts, joules, hertz, degrees Celsius, and
ratios 0–1 for every utilization (never percent).

On disk a table is a folder of Parquet segments, hive-partitioned by date and host:

    <telemetry dir>/<table>/date=YYYY-MM-DD/host=<hostname>/<segment>.parquet

`date` and `host` live only in the path (DuckDB reads them back with ``hive_partitioning``). Each
segment carries ``schema_version`` as a column and in its Parquet metadata, so readers can refuse a
mix they do not understand.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

SCHEMA_VERSION = 1

# Parquet key/value metadata stored in every segment.
METADATA_VERSION_KEY = b"gpupool.schema_version"
METADATA_TABLE_KEY = b"gpupool.table"

# Where a row came from. `simulated` rows are also flagged in their own boolean column, so that every
# reader can label them without knowing the list of sources.
# `lease`: NVML sampled inside a gpupool lease (gpuattach run): the lease's slice of a GPU of the pool.
SOURCES = ("nvml", "simulated", "replay", "nvidia-smi", "dcgm", "server", "lease")


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    unit: str  # "" where the value has no unit (names, ids)
    doc: str
    nvidia_smi: str = ""  # the nvidia-smi --query-gpu field that shows the same value, where one does
    valid: tuple | None = None  # (lo, hi), inclusive, in the column's unit: what a GPU can measure


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def arrow_schema(self) -> pa.Schema:
        meta = {METADATA_VERSION_KEY: str(SCHEMA_VERSION).encode(), METADATA_TABLE_KEY: self.name.encode()}
        return pa.schema([pa.field(c.name, c.type) for c in self.columns], metadata=meta)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


TS = pa.timestamp("us", tz="UTC")

# Physical ranges (``Column.valid``): a value outside one is not a measurement but a parse error, a
# driver's sentinel or a unit mix-up (999999 %, 10^23 MiB, -300 °C, year 9999). Every importer and the
# writer refuse a row holding one (``row_problem``, ``valid_mask``), so no figure is built on it.
RATIO = (0.0, 1.0)
TS_RANGE = (dt.datetime(2000, 1, 1, tzinfo=dt.UTC), dt.datetime(2100, 1, 1, tzinfo=dt.UTC))
GPU_INDEX = (0, 4095)  # a host's NVML indices (gpustat-collect --simulate takes at most 4096 GPUs)
MEMORY = (0, 2**44)  # 16 TiB: beyond any GPU's memory (the largest hold a few hundred GiB)
POWER = (0.0, 10_000.0)  # watts: a whole superchip board draws a few kW
ENERGY = (0.0, 1e13)  # joules since driver load: 10 kW for 30 years
TEMPERATURE = (-50.0, 200.0)  # celsius: colder than any machine room, hotter than any GPU's shutdown
CLOCK = (0.0, 1e10)  # hertz: 10 GHz
PID = (0, 2**31 - 1)
DURATION = (0.0, 1e10)  # seconds: 300 years
TEXT_MAX = 1024  # characters of a name, uuid, label: longer is not a name but a mangled line

_COMMON_HEAD = (
    Column("ts", TS, "UTC", "Time of the sample (end of the interval it summarises).", valid=TS_RANGE),
)
_COMMON_TAIL = (
    Column("source", pa.string(), "", f"Where the row came from: one of {', '.join(SOURCES)}."),
    Column("simulated", pa.bool_(), "", "True for rows of the simulated fleet: never real GPU data."),
    Column("schema_version", pa.int16(), "", "Version of this schema the row was written with."),
)

GPU_SAMPLES = Table(
    "gpu_samples",
    "One row per GPU per collector tick.",
    (
        *_COMMON_HEAD,
        Column("gpu_index", pa.int16(), "", "NVML index of the GPU on its host.", "index", GPU_INDEX),
        Column("gpu_uuid", pa.string(), "", "GPU UUID (stable across reboots).", "uuid"),
        Column("gpu_name", pa.string(), "", "Product name.", "name"),
        Column(
            "state", pa.string(), "", "'ok', or 'lost' when the GPU stopped answering (fell off the bus)."
        ),
        Column(
            "util_gpu_mean",
            pa.float32(),
            "ratio",
            "Mean of the driver's utilization.gpu samples (duty cycle: some kernel was running) since the last tick.",
            "utilization.gpu",
            RATIO,
        ),
        Column("util_gpu_max", pa.float32(), "ratio", "Max of the same samples.", valid=RATIO),
        Column(
            "util_mem_mean",
            pa.float32(),
            "ratio",
            "Mean of the memory-controller utilization samples since the last tick.",
            "utilization.memory",
            RATIO,
        ),
        Column("util_mem_max", pa.float32(), "ratio", "Max of the same samples.", valid=RATIO),
        Column("mem_used_bytes", pa.int64(), "bytes", "Device memory in use.", "memory.used", MEMORY),
        Column("mem_total_bytes", pa.int64(), "bytes", "Device memory in total.", "memory.total", MEMORY),
        Column("power_w", pa.float32(), "watts", "Power draw.", "power.draw", POWER),
        Column(
            "energy_j",
            pa.float64(),
            "joules",
            "Energy counter since driver load; read rarely (it costs ~4 ms), null on other ticks.",
            valid=ENERGY,
        ),
        Column(
            "temperature_c", pa.float32(), "celsius", "GPU core temperature.", "temperature.gpu", TEMPERATURE
        ),
        Column("sm_clock_hz", pa.float32(), "hertz", "SM clock.", "clocks.sm", CLOCK),
        Column(
            "sm_activity",
            pa.float32(),
            "ratio",
            "GPM: fraction of SM cycles with at least one warp resident, over all SMs (Hopper+).",
            valid=RATIO,
        ),
        Column(
            "sm_occupancy",
            pa.float32(),
            "ratio",
            "GPM: achieved warps / max warps per SM (Hopper+).",
            valid=RATIO,
        ),
        Column(
            "tensor_activity", pa.float32(), "ratio", "GPM: tensor pipe active ratio (Hopper+).", valid=RATIO
        ),
        Column(
            "dram_bw_util", pa.float32(), "ratio", "GPM: DRAM bandwidth used / peak (Hopper+).", valid=RATIO
        ),
        *_COMMON_TAIL,
    ),
)

PROCESS_SAMPLES = Table(
    "process_samples",
    "One row per process holding a GPU, per collector tick.",
    (
        *_COMMON_HEAD,
        Column("gpu_index", pa.int16(), "", "NVML index of the GPU on its host.", valid=GPU_INDEX),
        Column("gpu_uuid", pa.string(), "", "GPU UUID."),
        Column("pid", pa.int64(), "", "Host PID (NVML reports host PIDs, also for containers).", valid=PID),
        Column("process_name", pa.string(), "", "Executable name."),
        Column("user", pa.string(), "", "Owner of the process."),
        Column("container_id", pa.string(), "", "Container id from /proc/PID/cgroup, or null."),
        Column("mem_used_bytes", pa.int64(), "bytes", "GPU memory the process holds.", valid=MEMORY),
        Column(
            "sm_util",
            pa.float32(),
            "ratio",
            "Process busy share (nvmlDeviceGetProcessUtilization).",
            valid=RATIO,
        ),
        *_COMMON_TAIL,
    ),
)

POOL_EVENTS = Table(
    "pool_events",
    "Lease lifecycle events written by gpupool-server.",
    (
        *_COMMON_HEAD,
        Column("event", pa.string(), "", "grant, deny, release, expire or reclaim."),
        Column("lease_id", pa.string(), "", "Lease id (null for a denial)."),
        Column("client", pa.string(), "", "Client name the lease belongs to."),
        Column(
            "gpu_index",
            pa.int16(),
            "",
            "GPU of the partition (one row per GPU of the lease).",
            valid=GPU_INDEX,
        ),
        Column("gpu_uuid", pa.string(), "", "GPU UUID of the partition."),
        Column(
            "fraction", pa.float32(), "ratio", "Share of the GPU's memory the partition holds.", valid=RATIO
        ),
        Column("mem_bytes", pa.int64(), "bytes", "Memory of the partition.", valid=MEMORY),
        Column("duration_s", pa.float64(), "seconds", "Lease age at release/expire/reclaim.", valid=DURATION),
        Column("reason", pa.string(), "", "Why: the denial message, or why a lease ended."),
        Column(
            "job_scheduler", pa.string(), "", "Scheduler of the batch job the lease serves (slurm/CLUSTER)."
        ),
        Column("job_id", pa.string(), "", "That job's id in its scheduler (null: not a batch job's lease)."),
        Column(
            "job_account", pa.string(), "", "The job's account (Slurm --account), for GPU-hours per account."
        ),
        Column("job_user", pa.string(), "", "The user who submitted the job."),
        *_COMMON_TAIL,
    ),
)

CLOCK_STEPS = Table(
    "clock_steps",
    "One row per step back of a GPU's clock found in an imported log: the distinct samples logged after "
    "it were placed after their predecessors, in log order (collector._import_common.place_in_log_order).",
    (
        Column(
            "ts",
            TS,
            "UTC",
            "Where the first sample after the step was placed: one interval after the latest before it.",
            valid=TS_RANGE,
        ),
        Column("gpu_index", pa.int16(), "", "NVML index of the GPU on its host.", valid=GPU_INDEX),
        Column("gpu_uuid", pa.string(), "", "GPU UUID."),
        Column("stamped_ts", TS, "UTC", "The time the log stamped that sample.", valid=TS_RANGE),
        Column("step_s", pa.float64(), "seconds", "How far the clock stepped back.", valid=DURATION),
        Column(
            "samples",
            pa.int64(),
            "",
            "Samples placed later than stamped after this step (until the clock caught up or the log ended).",
        ),
        Column("file", pa.string(), "", "The log file's name."),
        Column("position", pa.string(), "", "Where in it: 'line N' (nvidia-smi) or 'scrape N' (dcgm)."),
        *_COMMON_TAIL,
    ),
)

TABLES: dict[str, Table] = {t.name: t for t in (GPU_SAMPLES, PROCESS_SAMPLES, POOL_EVENTS, CLOCK_STEPS)}


def _shown(value, unit: str) -> str:
    if unit == "ratio" and isinstance(value, int | float):
        return f"{value * 100:g} %"
    if unit == "bytes" and isinstance(value, int | float):
        return f"{value / 2**30:g} GiB"
    if isinstance(value, dt.datetime):
        return f"{value.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
    return f"{value:g} {unit}".rstrip() if isinstance(value, int | float) else repr(value)


def row_problem(table: Table, row: dict) -> str | None:
    """Why ``row`` cannot be stored in ``table`` (a value outside its column's ``valid`` range, NaN,
    infinite, a text too long to be a name), or None. One line, in the column's terms."""
    checks = _checks(table)
    for name, value in row.items():
        column = checks.get(name)
        if column is None or value is None:
            continue
        if isinstance(value, str):
            if len(value) > TEXT_MAX:
                return f"{name} is {len(value)} characters long (at most {TEXT_MAX})"
            continue
        if column.valid is None:
            continue
        if isinstance(value, float) and math.isnan(value):
            return f"{name} is NaN"
        lo, hi = column.valid
        if not lo <= value <= hi:
            return f"{name} {_shown(value, column.unit)} is outside {_shown(lo, column.unit)} to {_shown(hi, column.unit)}"
    return None


_CHECKS: dict[str, dict[str, Column]] = {}


def _checks(table: Table) -> dict[str, Column]:
    # The columns a row's values are checked against: ranged ones and texts (an importer checks
    # every row: one dict lookup per value).
    known = _CHECKS.get(table.name)
    if known is None:
        known = {c.name: c for c in table.columns if c.valid is not None or pa.types.is_string(c.type)}
        _CHECKS[table.name] = known
    return known


def valid_mask(table: Table, data: pa.Table) -> pa.ChunkedArray | None:
    """Per row of ``data`` (an Arrow table of ``table``'s columns): True where every value is within its
    column's range (or null); None where all are. The vectorised twin of ``row_problem``."""
    ok = None
    for c in table.columns:
        if c.name not in data.column_names:
            continue
        col = data.column(c.name)
        if pa.types.is_string(col.type):
            good = pc.less_equal(pc.utf8_length(col), TEXT_MAX)
        elif c.valid is None:
            continue
        else:
            lo, hi = (pa.scalar(v, col.type) for v in c.valid)
            good = pc.and_(pc.greater_equal(col, lo), pc.less_equal(col, hi))  # NaN compares false
        good = pc.fill_null(good, True)
        ok = good if ok is None else pc.and_(ok, good)
    if ok is None or pc.all(ok).as_py():
        return None
    return ok


def _rollup_table(name: str, period: str) -> Table:
    # Every additive column is a sum over the period's samples of their weight (seconds, as
    # collector.weights defines it) or of weight x value, so periods add up exactly.
    secs = "seconds"
    return Table(
        name,
        f"gpu_samples pre-aggregated per GPU per {period} (collector.rollups builds it from the raw rows).",
        (
            Column(
                "ts",
                TS,
                "UTC",
                f"Start of the {period}: the row sums the samples with ts in [ts, ts + 1 {period}).",
            ),
            Column("gpu_index", pa.int16(), "", "NVML index of the GPU (its newest in the period)."),
            Column("gpu_uuid", pa.string(), "", "GPU UUID."),
            Column("gpu_name", pa.string(), "", "Product name (its newest in the period)."),
            Column(
                "fb",
                pa.int64(),
                "microseconds",
                "Null, or for samples that had no local spacing: their interval (-1: none). Such rows "
                "hold weights in units of the fleet's tick, scaled when a query knows it (collector.weights).",
            ),
            Column("samples", pa.int64(), "", "Number of samples."),
            Column("first_ts", TS, "UTC", "First sample."),
            Column("last_ts", TS, "UTC", "Last sample."),
            Column("observed_s", pa.float64(), secs, "Observed time: the sum of the samples' weights."),
            Column("gap_s", pa.float64(), secs, "Unobserved rest of gap intervals that start in the period."),
            Column("util_s", pa.float64(), secs, "Observed time with utilization.gpu."),
            Column(
                "util_sum", pa.float64(), "ratio x seconds", "Sum of weight x utilization.gpu (0.001 steps)."
            ),
            Column(
                "util_gpm_s", pa.float64(), secs, "Observed time with both utilization.gpu and SM activity."
            ),
            Column("util_gpm_sum", pa.float64(), "ratio x seconds", "Sum of weight x utilization.gpu there."),
            Column("sm_s", pa.float64(), secs, "Observed time with GPM SM activity."),
            Column("sm_sum", pa.float64(), "ratio x seconds", "Sum of weight x SM activity (0.001 steps)."),
            Column(
                "util_raw_sum", pa.float64(), "ratio x seconds", "Sum of weight x utilization.gpu as stored."
            ),
            Column("sm_raw_sum", pa.float64(), "ratio x seconds", "Sum of weight x SM activity as stored."),
            Column(
                "util_n", pa.int64(), "", "Samples with utilization.gpu (the what-if's plain per-step means)."
            ),
            Column("util_plain_sum", pa.float64(), "ratio", "Sum of utilization.gpu as stored, unweighted."),
            Column("mem_ratio_s", pa.float64(), secs, "Observed time with a memory size."),
            Column("mem_ratio_sum", pa.float64(), "ratio x seconds", "Sum of weight x memory used / size."),
            Column("mem_s", pa.float64(), secs, "Observed time with memory used."),
            Column("mem_used_sum", pa.float64(), "byte-seconds", "Sum of weight x memory used."),
            Column("mem_used_peak", pa.int64(), "bytes", "Most memory used."),
            Column("mem_total", pa.int64(), "bytes", "Memory size."),
            Column("idle_s", pa.float64(), secs, "Observed time idle under the rollup's idle_below."),
            Column(
                "held_idle_s", pa.float64(), secs, "Idle with at least the rollup's held_mem_bytes in use."
            ),
            Column("lost_s", pa.float64(), secs, "Observed time with state 'lost'."),
            Column("simulated_s", pa.float64(), secs, "Observed time of simulated rows."),
            Column(
                "util_hist_bin",
                pa.list_(pa.int16()),
                "percent",
                "utilization.gpu histogram: 1 % bins (k: [k, k+1) %).",
            ),
            Column("util_hist_s", pa.list_(pa.float64()), secs, "Observed time per bin of util_hist_bin."),
            Column("sm_hist_bin", pa.list_(pa.int16()), "percent", "SM activity histogram: 1 % bins."),
            Column("sm_hist_s", pa.list_(pa.float64()), secs, "Observed time per bin of sm_hist_bin."),
            Column(
                "interval_us",
                pa.list_(pa.int64()),
                "microseconds",
                "Intervals to the next sample, binned to 10 ms.",
            ),
            Column("interval_n", pa.list_(pa.int64()), "", "How many intervals per bin of interval_us."),
            Column("schema_version", pa.int16(), "", "Version of this schema the row was written with."),
        ),
    )


# Pre-aggregated telemetry (see collector.rollups): same layout as the raw tables, one file per
# date and host (``<table>/date=D/host=H/rollup.parquet``; hours and days: D is the first day of a month),
# replaced atomically when a build writes it.
GPU_ROLLUP_MINUTE = _rollup_table("gpu_rollup_1m", "minute")
GPU_ROLLUP_HOUR = _rollup_table("gpu_rollup_1h", "hour")
GPU_ROLLUP_DAY = _rollup_table("gpu_rollup_1d", "day")  # made from the hour rows (UTC days)
ROLLUP_TABLES: dict[str, Table] = {t.name: t for t in (GPU_ROLLUP_MINUTE, GPU_ROLLUP_HOUR, GPU_ROLLUP_DAY)}
# Footer metadata of a rollup file (JSON): the period it covers, the thresholds it fixed, the watermark.
METADATA_ROLLUP_KEY = b"gpupool.rollup"

# Where damaged segments are moved aside (``<root>/damaged/<table>/date=D/host=H/<name>``): not a table,
# so no reader lists it.
DAMAGED_DIR = "damaged"

# Hive partition columns and the types readers must give them (a host named "007" stays a string).
PARTITION_TYPES = {"date": "DATE", "host": "VARCHAR"}
