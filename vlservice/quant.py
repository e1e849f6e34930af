"""Memory and speed levers on the PyTorch side, both opt-in or safe by construction.

- `quantize_llm_int8(model)`: `VL_LLM_QUANT=int8` turns every `nn.Linear` of the language model and
  the LM head into PyTorch's dynamically quantised INT8 linear (per-channel int8 weights, int8
  activations quantised on the fly, fbgemm kernels). The float32 weights of those layers are
  dropped as each layer is replaced. Decoding reads a quarter of the bytes; answers can differ
  from float32 (`python -m vlservice compare` measures by how much on your own images).
- `release_torch_vision(model)`: with an ONNX vision backend the PyTorch vision tower's weights are
  never used again (only its grid parameters are), so they are freed: 1.6 GB for the real model.
"""

from __future__ import annotations

import logging
import time
import warnings

log = logging.getLogger("vlservice.quant")


def quantize_llm_int8(model) -> float:
    import torch

    t0 = time.perf_counter()
    text = model.model.language_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        for layer in text.layers:
            quantize_dynamic(layer, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
        # The head is tied to the embedding: untie it (the embedding stays float32 for lookups),
        # then quantise the head alone; it is read in full for every generated token.
        head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False)
        head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone(), requires_grad=False)
        model.lm_head = quantize_dynamic(torch.nn.Sequential(head), {torch.nn.Linear}, dtype=torch.qint8)[0]
    seconds = time.perf_counter() - t0
    log.info("LLM quantised to INT8 in %.1f s", seconds)
    return seconds


def release_torch_vision(model) -> int:
    """Free the vision tower's weights (ONNX Runtime has its own copy); returns bytes freed."""
    import torch

    freed = 0
    for p in model.model.visual.parameters():
        freed += p.numel() * p.element_size()
        p.data = torch.empty(0, dtype=p.dtype)
    return freed
