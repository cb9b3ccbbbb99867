"""gpupool server."""
