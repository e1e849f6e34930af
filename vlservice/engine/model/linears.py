"""The language model's linears rewritten for batching and speed, in place, after loading
(`runners.load_lm`): per-row INT8 activation scales so a sequence's answer does not depend on its
batch mates (`make_rows_independent`), q/k/v and gate/up fused into one INT8 product each
(`fuse_int8_projections`), and float32 weights prepacked for oneDNN (`prepack_llm`). The INT8
weights themselves are made and stored by `quant`."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .quant import _Checkpoint, _dynamic_linear, _float_embedding_class

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- batch-safe INT8

def make_rows_independent(model) -> int:
    """Give every dynamic INT8 linear of the LLM per-row activation scales; returns how many.

    PyTorch's dynamic INT8 linear quantises its input with ONE scale for the whole tensor (from
    its min and max), so in a batch a row's result depends on the other rows (29% relative error
    beside a row 20x larger): a request's answer would depend on who shares its batch. Per-row
    scales without a slower kernel: each row is divided by its own absolute maximum, so every
    row lies in [-1, 1], and one extra row holding -1 and +1 pins the tensor's range to exactly
    [-1, 1] whatever the batch; the integer products are then each row's alone, and the outputs
    are multiplied back by the rows' scales. The extra row costs one more row of a product whose
    time is set by streaming the weights.
    """
    count = 0
    for module in model.modules():
        if type(module) is _dynamic_linear():
            module.__class__ = _RowScaledLinear()
            count += 1
    return count


_ROW_SCALED = None


def _RowScaledLinear():  # noqa: N802 - a class made on first use (torch is imported lazily here)
    global _ROW_SCALED
    if _ROW_SCALED is None:
        import torch

        base = _dynamic_linear()

        class RowScaledDynamicLinear(base):
            def forward(self, x):
                shape = x.shape
                rows = x.reshape(-1, shape[-1])
                scale = rows.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30)
                pin = self.__dict__.get("_pin")
                if pin is None or pin.dtype != rows.dtype:  # made once per module, not per call
                    pin = rows.new_zeros(1, shape[-1])
                    pin[0, 0], pin[0, -1] = -1.0, 1.0
                    self.__dict__["_pin"] = pin
                y = torch.ops.quantized.linear_dynamic(torch.cat([rows / scale, pin]),
                                                       self._packed_params._packed_params, reduce_range=True)[:-1]
                # the bias, read once: `self.bias()` unpacks the whole int8 weight matrix on every
                # call (fbgemm's PackBMatrix::unpack), seconds per token for the LM head
                # (kept with the packed weights it belongs to: set_weight_bias makes new ones)
                packed, bias = self.__dict__.get("_bias", (None, None))
                if packed is not self._packed_params._packed_params:
                    packed, bias = self._packed_params._packed_params, self.bias()
                    self.__dict__["_bias"] = (packed, bias)
                y = y * scale if bias is None else (y - bias) * scale + bias
                return y.view(*shape[:-1], y.shape[-1])

            def _get_name(self):
                return "RowScaledDynamicQuantizedLinear"

        _ROW_SCALED = RowScaledDynamicLinear
    return _ROW_SCALED


# --------------------------------------------------------------------------- prepacked float32

def prepack_llm(model, model_dir: Path) -> dict:
    """Float32 linears of the LLM (the 28 decoder layers' projections and the LM head) with their
    weights reordered once for oneDNN, in place of the plain ones; returns what it did.

    With plain `nn.Linear` MKL repacks the weight matrix on every small-M call, which a decode
    step pays 196 times; a weight prepacked at load is read as it lies. The packed copy replaces
    the plain weight (which is then freed), and it is made before Gunicorn forks, so workers
    share it. The LM head is tied to the token embedding: once the head is packed, the embedding
    lookups read the checkpoint's own tensor, memory-mapped (rows become resident as tokens use
    them, shared by every worker), instead of keeping a second float32 copy of 1.2 GB.
    """
    import torch

    t0 = time.perf_counter()
    text = model.model.language_model
    count = 0
    for layer in text.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(parent, name, PackedLinear(child))
                    count += 1
    ckpt = _Checkpoint(Path(model_dir))
    embed_key = "model.language_model.embed_tokens.weight"
    head = model.lm_head
    if type(head) is torch.nn.Linear:
        model.lm_head = PackedLinear(head)
        count += 1
        if embed_key in ckpt:  # untie: the embedding reads the mapped checkpoint tensor
            text.embed_tokens = _float_embedding_class()(ckpt.get(embed_key))
    return {"packed_linears": count, "prepack_s": time.perf_counter() - t0}


_PACKED = None


def PackedLinear(linear):  # noqa: N802 - builds the module class on first use (torch imported lazily)
    global _PACKED
    if _PACKED is None:
        import torch

        class _PackedLinear(torch.nn.Module):
            """`nn.Linear` with its weight in oneDNN's blocked layout (`_reorder_linear_weight`)."""

            def __init__(self, linear):
                super().__init__()
                self.in_features, self.out_features = linear.in_features, linear.out_features
                weight = linear.weight.detach().float().contiguous()
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
                self.bias = None if linear.bias is None else linear.bias.detach().float()

            def forward(self, x):
                return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

            def extra_repr(self):
                return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN prepacked"

        _PACKED = _PackedLinear
    return _PACKED(linear)


# --------------------------------------------------------------------------- fused INT8 projections

def fuse_int8_projections(model) -> int:
    """Each decoder layer's q/k/v and gate/up INT8 linears as one product each; returns how many
    fused products were made.

    A decode step then quantises each layer's input activations twice instead of five times and
    makes 4 INT8 calls instead of 7 (the Python around every call is a measurable share of an
    INT8 token). The results are the same bits: the weights are per output channel and the
    products accumulate in int32, so a column does not depend on its neighbours. The old modules
    become slices of the fused one, so the model's own forward still runs (computing the fused
    product per slice); `LeanLM` calls the fused product once. One copy of the weights.
    """
    import torch

    Row = _RowScaledLinear()
    made = 0
    for layer in model.model.language_model.layers:
        for parent, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj")), (layer.mlp, ("gate_proj", "up_proj"))):
            mods = [getattr(parent, n) for n in names]
            if not all(type(m) is Row for m in mods):
                continue
            weights, biases = zip(*(m._packed_params._weight_bias() for m in mods))
            q = torch.cat([w.int_repr() for w in weights])
            scales = torch.cat([w.q_per_channel_scales() for w in weights])
            zeros = torch.cat([w.q_per_channel_zero_points() for w in weights])
            bias = None
            if any(b is not None for b in biases):
                bias = torch.cat([b if b is not None else torch.zeros(w.shape[0]) for w, b in zip(weights, biases)])
            fused = _dynamic_linear()(q.shape[1], q.shape[0], bias_=bias is not None, dtype=torch.qint8)
            fused.set_weight_bias(torch._make_per_channel_quantized_tensor(q, scales.double(), zeros.long(), 0), bias)
            fused.__class__ = Row
            start = 0
            for name, w in zip(names, weights):
                setattr(parent, name, FusedSlice(fused, start, start + w.shape[0]))
                start += w.shape[0]
            made += 1
    return made


_SLICE = None


def FusedSlice(fused, start: int, end: int):  # noqa: N802 - the module class is made on first use
    global _SLICE
    if _SLICE is None:
        import torch

        class _FusedSlice(torch.nn.Module):
            """Columns [start, end) of a fused product: what one of the fused linears computed."""

            def __init__(self, fused, start, end):
                super().__init__()
                self.fused, self.start, self.end = fused, start, end
                self.in_features, self.out_features = fused.in_features, end - start

            def forward(self, x):
                return self.fused(x)[..., self.start:self.end]

            def extra_repr(self):
                return f"columns {self.start}:{self.end} of a fused INT8 product"

        _SLICE = _FusedSlice
    return _SLICE(fused, start, end)
