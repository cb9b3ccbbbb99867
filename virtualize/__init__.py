"""Remote execution, end to end: a program's CUDA driver calls run on a leased GPU (docs/remote.md).

Three subpackages, by where the code runs (the client and server sides import nothing of each other):

- ``client``: in the program's process. ``cli`` is ``gpuattach`` (thin: parse, call the pool's client
  ``server.client``, print); ``remote``: the shim's directory and the environment that sends a
  command's calls to its lease; ``shim/``: gpupool's ``libcuda.so.1`` (C); ``nvml/``, ``localcuda/``:
  the NVML shim and the --local interposer; ``slurm``, ``_keeper``, ``_session``, ``_nvml_view``
- ``common``: what both ends read. ``_calls``: the one table of forwarded calls and their wire layouts;
  ``_wire``: frames, flags, environment names; ``_results``: CUresult codes; ``errors``; ``_census``;
  ``_shimgen``: the generator of both sides' C tables (``calls_gen*.h``, ``native/dispatch_gen.h``)
- ``server``: the worker on the GPU host, started by the pool through ``server.workers`` (which never
  imports it). ``worker``: the worker process (``python -m virtualize.server.worker``): connections,
  hello, activity; ``_executor_guard``: decodes each call with the table, checks it against the lease,
  dispatches (its concerns in ``_guard_*``); ``_executor``: the executor contract, one method per
  forwarded call declared from the table; ``_cuda``: the CUDA executor, the one module that imports
  cuda.bindings; ``_executor_host``: a host-memory executor for tests without a GPU; ``native/``: the
  worker's native loop
"""
