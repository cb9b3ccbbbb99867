"""gpupool reports."""
