"""gpupool tui."""
