"""gpupool virtualize."""
