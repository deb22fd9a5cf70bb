"""DeBERTa-v2 (and v3): post-norm, bidirectional, disentangled relative attention.

The attention scores add content-to-position and position-to-content terms
(``pos_key_proj``/``pos_query_proj`` on the shared ``encoder.rel_embeddings``) to the
content-to-content term; the values are content only. So the power view's
F = sum_h W_O^h W_V^h is the content value/output path (``value_proj`` then
``attention.output.dense``), exact for what attention writes; the relative-position
projections are excluded from F because they act on the scores alone, like every query/key.
The Jacobian view replays the real block: relative positions included.

Refused: ``conv_kernel_size > 0`` (deberta-v2-xlarge style), whose encoder adds a
convolution outside the blocks after the first layer, so block outputs are not the residual
stream the next block reads.
"""

from typing import Any, Optional

from .calls import BlockCallConvention
from .hf import HFFamily, register


def _conv_outside_blocks(config: Any) -> Optional[str]:
    if getattr(config, "conv_kernel_size", 0) > 0:
        return ("DeBERTa-v2 with conv_kernel_size > 0 adds a convolution between the first "
                "and second block, outside the blocks, which spectral_hooks does not model; "
                "describe it with spectral_hooks.register_anatomy")
    return None


DEBERTA_V2 = register(HFFamily(
    name="deberta_v2", model_types=("deberta-v2",), blocks="encoder.layer",
    attention="attention.self", value="attention.self.value_proj",
    output="attention.output.dense", attn_out="attention.output.dropout", attn_norm=None,
    norm_placement="post", causal=False,
    call_convention=BlockCallConvention(pluggable_attention=False),  # its own attention code
    unsupported=_conv_outside_blocks, attention_type="disentangled relative",
    power_view="content path (relative-position score terms excluded)",
    tested_by="tests/families/test_encoders.py",
))
