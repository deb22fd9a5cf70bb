"""Log spectral metrics while fine-tuning (a tiny GPT-2 built offline; swap in your model).

Run: python examples/finetune_logging.py [out.csv]
"""

import sys

import pandas as pd
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import spectral_hooks as sh

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                   n_positions=64))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, 100, (16, 12))
rows = []
probe = sh.instrument(model, layers=None, capture=["resid_pre", "resid_post"])
for step in range(6):
    model.train()
    batch = data[(step * 4) % 16:(step * 4) % 16 + 4]
    loss = model(batch, labels=batch).loss       # the probe records, gradients are untouched
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step % 2 == 0:                            # every few steps: metrics of this batch
        power = probe.analyze(power=True).power
        rows.append(power.assign(step=step, loss=float(loss))[
            ["step", "loss", "layer", "abs_lambda1", "gap_ratio", "gamma", "lift"]])
    probe.clear()                                # keep memory flat
probe.remove()
log = pd.concat(rows, ignore_index=True)
print(log.to_string(index=False))
if len(sys.argv) > 1:
    log.to_csv(sys.argv[1], index=False)
