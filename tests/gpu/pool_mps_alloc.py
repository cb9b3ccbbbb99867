"""Run under `gpuattach run --local -n 1 -p P`: is PyTorch refused memory beyond its partition?

Prints one JSON line: the partition, what the process sees, and which allocations succeeded.
"""

import json
import os

import torch

limit = int(os.environ["GPUPOOL_MEM_LIMIT_BYTES"].split(",")[0])
free, total = torch.cuda.mem_get_info(0)
result = {
    "limit_bytes": limit,
    "seen_total_bytes": total,
    "seen_free_bytes": free,
    "mps_limit_env": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
    "device": torch.cuda.get_device_name(0),
}


def try_alloc(nbytes: int) -> bool:
    try:
        x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        del x
        torch.cuda.empty_cache()
        return True
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:  # MPS may surface it as a CUDA error
        result.setdefault("refusals", []).append(str(exc).splitlines()[0][:200])
        torch.cuda.empty_cache()
        return False


result["alloc_70pct_ok"] = try_alloc(int(limit * 0.7))
result["alloc_130pct_ok"] = try_alloc(int(limit * 1.3))
print(json.dumps(result), flush=True)
