"""gpupool reports."""

DIRS_ENV = "GPUPOOL_REPORT_DIRS"  # the telemetry directories the app reads (os.pathsep-separated; s3:// locations keep their ':')
