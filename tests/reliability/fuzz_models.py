"""Hypothesis strategies for the property tests: tiny random configs of every norm type the
anatomy knows (LayerNorm pre-norm, BERT/ALBERT post-LN, RMSNorm pre-norm, Gemma's (1 + w)
RMSNorm with sandwich norms in Gemma 2, OLMo2's post-norms), base models and LM-head wrappers with
tied or untied embeddings, random norm gains, batches with padding, and the checks every
instrumented run must pass."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch
import transformers as tf
from hypothesis import example
from hypothesis import strategies as st

FULL = os.environ.get("SPECTRAL_HOOKS_FULL") == "1"
VOCAB = 50
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
LLAMA_LIKE = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "olmo2": "Olmo2",
              "gemma": "Gemma", "gemma2": "Gemma2"}
#: norm type -> the families that have it (a case draws the norm type first, then a family)
NORMS = {"layernorm": ("gpt2", "gpt_neox"), "post_layernorm": ("bert", "albert"),
         "rmsnorm": ("llama", "qwen2", "mistral"), "gemma_rmsnorm": ("gemma", "gemma2"),
         "post_rmsnorm": ("olmo2",)}
FAMILIES = tuple(f for families in NORMS.values() for f in families)
CAUSAL = {f: f not in ("bert", "albert") for f in FAMILIES}
WRAPPERS = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "albert": "AlbertForMaskedLM",
            "gpt_neox": "GPTNeoXForCausalLM",
            **{f: f"{name}ForCausalLM" for f, name in LLAMA_LIKE.items()}}


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
    norm: str = "layernorm"  # a key of NORMS
    wrapper: bool = False  # the LM-head model (WRAPPERS) instead of the base model
    tied: bool = True  # tie_word_embeddings (wrappers only)

    @property
    def d(self) -> int:
        return self.n_heads * self.head_dim


def _config(case: Case):
    d, L, H = case.d, case.n_layers, case.n_heads
    common = dict(vocab_size=VOCAB, max_position_embeddings=32,
                  tie_word_embeddings=case.tied)
    if case.family == "gpt2":
        config, cls = tf.GPT2Config(vocab_size=VOCAB, n_embd=d, n_layer=L, n_head=H,
                                    n_positions=32, bos_token_id=0, eos_token_id=0,
                                    tie_word_embeddings=case.tied), tf.GPT2Model
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
        name = LLAMA_LIKE[case.family]
        extra = {"sliding_window": 4} if case.family == "gemma2" else {}
        extra.update(bos_token_id=0, eos_token_id=0, pad_token_id=0)  # inside the vocabulary
        config = getattr(tf, f"{name}Config")(**common, **extra, hidden_size=d,
                                              intermediate_size=2 * d, num_hidden_layers=L,
                                              num_attention_heads=H,
                                              num_key_value_heads=case.kv_heads,
                                              head_dim=case.head_dim)
        cls = getattr(tf, f"{name}Model")
    return config, cls


def _perturb_norms(model: torch.nn.Module, g: torch.Generator) -> None:
    """Random norm gains and biases (Gemma's w of (1 + w) starts at 0, the others at 1)."""
    with torch.no_grad():
        for module in model.modules():
            if "norm" not in type(module).__name__.lower():
                continue
            for param in module.parameters(recurse=False):
                param.add_(0.3 * torch.randn(param.shape, generator=g, dtype=param.dtype))


def build(case: Case) -> torch.nn.Module:
    """The tiny model of ``case`` (weights from torch's generator seeded with case.seed)."""
    config, cls = _config(case)
    if case.wrapper:
        cls = getattr(tf, WRAPPERS[case.family])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        model = cls(config)
    _perturb_norms(model, torch.Generator().manual_seed(case.seed))
    if case.wrapper:
        embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
        assert (embeddings.weight is head.weight) == case.tied, "tie_word_embeddings ignored"
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
def cases(draw, *, min_d: int = 1, max_d: int = 32, dtypes=DTYPES, norms=tuple(NORMS),
          max_layers: int = 3) -> Case:
    # one draw for (norm type, base / tied wrapper / untied wrapper): separate draws left some
    # combinations out of the 270 derandomized examples
    combo = draw(st.integers(0, 3 * len(norms) - 1))
    norm, variant = norms[combo % len(norms)], combo // len(norms)
    family = draw(st.sampled_from(NORMS[norm]))
    head_dim = draw(st.sampled_from([h for h in (2, 4, 8) if h <= max_d]))
    n_heads = draw(st.sampled_from([h for h in (1, 2, 4)
                                    if min_d <= h * head_dim <= max_d] or [max_d // head_dim]))
    kv_heads = draw(st.sampled_from([k for k in (1, 2, 4) if n_heads % k == 0])) \
        if family in LLAMA_LIKE else n_heads
    return Case(family=family, n_layers=draw(st.integers(1, max_layers)), n_heads=n_heads,
                kv_heads=kv_heads, head_dim=head_dim, dtype=draw(st.sampled_from(dtypes)),
                batch=draw(st.integers(1, 3)), seq=draw(st.integers(1, 6)),
                padding=draw(st.sampled_from(("none", "left", "right", "ragged"))),
                seed=draw(st.integers(0, 2**16)), norm=norm, wrapper=variant > 0,
                tied=variant < 2)


def every_norm_and_variant(test):
    """``test`` (a ``@given(case=cases())`` test) with one explicit example for each norm type
    as a base model, a tied wrapper and an untied wrapper, whatever the drawn examples cover
    (the derandomized draws change with the test's source)."""
    for i, (norm, families) in enumerate(NORMS.items()):
        family = families[i % len(families)]
        for wrapper, tied in ((False, True), (True, True), (True, False)):
            test = example(case=Case(family=family, n_layers=2, n_heads=2,
                                     kv_heads=1 if family in LLAMA_LIKE else 2,
                                     head_dim=4, dtype=torch.float32, batch=2, seq=4,
                                     padding="right", seed=7 + i, norm=norm, wrapper=wrapper,
                                     tied=tied))(test)
    return test


def state_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def hidden(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """The base model's last hidden state, or a wrapper's logits."""
    with torch.no_grad():
        out = model(**batch)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state
