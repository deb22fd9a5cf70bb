"""Imports every built-in family so that each registers itself (order = lookup order)."""

from . import (  # noqa: F401
    bert,
    gpt2,
    gpt_neo,
    gpt_neox,
    llama,
    tlens,  # noqa: F401  (TransformerLens first: a bridge also holds an HF model)
)
