"""Checkpoints the project makes itself (no hub is reachable): random-weight Qwen3-VL checkpoints of
any size, the real one's architecture included (`checkpoints`), and their tokenizer (`tokenizer`).
Below the demo and the tools, which both build on them."""
