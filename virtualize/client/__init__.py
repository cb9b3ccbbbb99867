"""What runs in the program's process: gpuattach, the shims (shim/, nvml/, localcuda/), the Slurm hook."""
