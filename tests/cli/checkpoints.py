"""Base checkpoints as ``save_pretrained`` writes them, built offline: a tiny random model of a
family and its real tokenizer class, trained here on a few sentences (a byte-level BPE), with
no pad token (as base GPT-2, Llama, Mistral, Qwen3 and Gemma checkpoints ship).

    >>> from tests.cli.checkpoints import write_checkpoint
    >>> path = write_checkpoint("gpt2", tmp_dir)       # doctest: +SKIP
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

FAMILIES = ("gpt2", "llama", "mistral", "qwen3", "gemma")
VOCAB = 512
SENTENCES = ("hello world", "The quick brown fox jumps over the lazy dog.",
             "Paris is the capital of France, and Berlin is the capital of Germany.")


@lru_cache(maxsize=None)
def _vocab_merges(specials: tuple[str, ...]) -> tuple[dict[str, int], list[tuple[str, ...]]]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[assignment]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(specials),  # type: ignore[call-arg]
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(SENTENCES, trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return model["vocab"], merges


def _tokenizer(family: str):
    import transformers

    tf: Any = transformers  # the tokenizer classes' hints say pad_token cannot be None
    if family == "gpt2":
        return tf.GPT2Tokenizer(*_vocab_merges(("<|endoftext|>",)))
    if family in ("llama", "mistral"):
        return tf.LlamaTokenizer(*_vocab_merges(("<unk>", "<s>", "</s>")))
    if family == "qwen3":
        return tf.Qwen2Tokenizer(*_vocab_merges(("<|endoftext|>",)), pad_token=None)
    if family == "gemma":
        return tf.GemmaTokenizer(*_vocab_merges(("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")),
                                 pad_token=None)
    raise ValueError(family)


def _model(family: str, eos: int | None, bos: int | None):
    import transformers as tf

    llama_like: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128)
    config = {
        "gpt2": lambda: tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                      n_positions=128),
        "llama": lambda: tf.LlamaConfig(**llama_like),
        "mistral": lambda: tf.MistralConfig(**llama_like),
        "qwen3": lambda: tf.Qwen3Config(**llama_like, head_dim=8),
        "gemma": lambda: tf.GemmaConfig(**llama_like, head_dim=8),
    }[family]()
    config.eos_token_id, config.bos_token_id, config.pad_token_id = eos, bos, None
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(config).eval()


def write_checkpoint(family: str, directory: Path, *, tokenizer: bool = True) -> Path:
    """``directory`` holding a base ``family`` checkpoint (the LM-head model, as published),
    with its tokenizer unless ``tokenizer=False``; the tokenizer has no pad token."""
    directory = Path(directory)
    tok = _tokenizer(family)
    assert tok.pad_token is None, family
    _model(family, tok.eos_token_id, tok.bos_token_id).save_pretrained(directory)
    if tokenizer:
        tok.save_pretrained(directory)
    return directory
