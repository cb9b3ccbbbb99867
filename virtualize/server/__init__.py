"""What runs on the GPU host: the worker process, its guard and executors, the native loop (native/)."""
