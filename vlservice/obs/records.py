"""What every committed record names: the CPU it ran on (as read) and when and by which command it
was made. Here, below the engine, the demo and the tools, so that each of them can write records
without importing another's code."""

from __future__ import annotations

import os
import sys
import time

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def cpu_info(threads: int) -> dict:
    """The CPU this ran on: model name, the flags that matter for these kernels, threads."""
    from .cpu import cpu_model_and_flags

    model, flags = cpu_model_and_flags()
    return {"model": model, "flags": [f for f in FLAGS if f in flags], "threads": threads,
            "logical_cpus": os.cpu_count()}


def run_record() -> dict:
    """When and by which command a report was made (every committed number names both)."""
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python -m vlservice " + " ".join(sys.argv[1:])}
