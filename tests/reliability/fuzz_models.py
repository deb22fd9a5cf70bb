"""Hypothesis strategies for the property tests: tiny random configs of every family the
anatomy knows, batches with padding, and the checks every instrumented run must pass."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch
import transformers as tf
from hypothesis import strategies as st

FULL = os.environ.get("SPECTRAL_HOOKS_FULL") == "1"
VOCAB = 50
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
LLAMA_LIKE = {"llama": "LlamaConfig/LlamaModel", "qwen2": "Qwen2Config/Qwen2Model",
              "mistral": "MistralConfig/MistralModel", "olmo2": "Olmo2Config/Olmo2Model"}
FAMILIES = ("gpt2", "bert", "albert", "gpt_neox", *LLAMA_LIKE)
CAUSAL = {f: f not in ("bert", "albert") for f in FAMILIES}


@dataclass(frozen=True)
class Case:
    family: str
    n_layers: int
    n_heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    batch: int
    seq: int
    padding: str  # "none", "left", "right" or "ragged"
    seed: int

    @property
    def d(self) -> int:
        return self.n_heads * self.head_dim


def build(case: Case) -> torch.nn.Module:
    """The tiny model of ``case`` (weights from torch's generator seeded with case.seed)."""
    d, L, H = case.d, case.n_layers, case.n_heads
    common = dict(vocab_size=VOCAB, max_position_embeddings=32)
    if case.family == "gpt2":
        config, cls = tf.GPT2Config(vocab_size=VOCAB, n_embd=d, n_layer=L, n_head=H,
                                    n_positions=32, bos_token_id=0, eos_token_id=0), tf.GPT2Model
    elif case.family == "bert":
        config, cls = tf.BertConfig(**common, hidden_size=d, num_hidden_layers=L,
                                    num_attention_heads=H, intermediate_size=2 * d), tf.BertModel
    elif case.family == "albert":
        config, cls = tf.AlbertConfig(**common, embedding_size=8, hidden_size=d,
                                      num_hidden_layers=L, num_attention_heads=H,
                                      intermediate_size=2 * d), tf.AlbertModel
    elif case.family == "gpt_neox":
        config, cls = tf.GPTNeoXConfig(**common, hidden_size=d, num_hidden_layers=L,
                                       num_attention_heads=H, intermediate_size=2 * d,
                                       bos_token_id=0, eos_token_id=0), tf.GPTNeoXModel
    else:
        config_name, model_name = LLAMA_LIKE[case.family].split("/")
        config = getattr(tf, config_name)(**common, hidden_size=d, intermediate_size=2 * d,
                                          num_hidden_layers=L, num_attention_heads=H,
                                          num_key_value_heads=case.kv_heads, head_dim=case.head_dim)
        cls = getattr(tf, model_name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        model = cls(config)
    return model.to(case.dtype).eval()


def inputs(case: Case) -> dict:
    """input_ids and an attention_mask with at least one real token in every row."""
    g = torch.Generator().manual_seed(case.seed)
    ids = torch.randint(1, VOCAB, (case.batch, case.seq), generator=g)
    mask = torch.ones_like(ids)
    for row in range(case.batch):
        if case.padding == "none" or case.seq == 1:
            continue
        n_pad = int(torch.randint(0, case.seq, (1,), generator=g))  # < seq: a real token stays
        if case.padding == "right":
            mask[row, case.seq - n_pad:] = 0
        elif case.padding == "left":
            mask[row, :n_pad] = 0
        else:  # ragged: random holes, first real token kept
            holes = torch.rand(case.seq, generator=g) < 0.4
            holes[int(torch.randint(0, case.seq, (1,), generator=g))] = False
            mask[row, holes] = 0
    return {"input_ids": ids, "attention_mask": mask}


@st.composite
def cases(draw, *, min_d: int = 1, max_d: int = 32, dtypes=DTYPES, families=FAMILIES,
          max_layers: int = 3) -> Case:
    family = draw(st.sampled_from(families))
    head_dim = draw(st.sampled_from([h for h in (2, 4, 8) if h <= max_d]))
    n_heads = draw(st.sampled_from([h for h in (1, 2, 4)
                                    if min_d <= h * head_dim <= max_d] or [max_d // head_dim]))
    kv_heads = draw(st.sampled_from([k for k in (1, 2, 4) if n_heads % k == 0])) \
        if family in LLAMA_LIKE else n_heads
    return Case(family=family, n_layers=draw(st.integers(1, max_layers)), n_heads=n_heads,
                kv_heads=kv_heads, head_dim=head_dim, dtype=draw(st.sampled_from(dtypes)),
                batch=draw(st.integers(1, 3)), seq=draw(st.integers(1, 6)),
                padding=draw(st.sampled_from(("none", "left", "right", "ragged"))),
                seed=draw(st.integers(0, 2**16)))


def n_hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def state_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def hidden(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).last_hidden_state
