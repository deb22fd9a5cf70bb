"""Imports every built-in family so that each registers itself (order = lookup order).

The one list of them: the package ``spectral_hooks.anatomy`` imports it, so the built-ins are
registered before any anatomy module is used, and the registry (:mod:`.registry`) imports no
family.

TransformerLens comes first: a TL 4 bridge also holds an HF model, which the HF families would
otherwise claim. The ``isort: split`` keeps the import sorter from merging the two lines.
"""

from . import tlens  # noqa: F401

# isort: split
from . import (  # noqa: F401
    alibi,
    bert,
    deberta,
    decoders,
    distilbert,
    falcon,
    gpt2,
    gpt_neo,
    gpt_neox,
    hybrid,
    llama,
    modernbert,
    moe,
    mpnet,
    seq2seq,
    vision,
)
