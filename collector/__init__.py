"""GPU telemetry: sample GPUs (NVML, a simulated fleet, replayed data) into Parquet segments."""
