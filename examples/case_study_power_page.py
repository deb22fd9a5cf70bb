"""The page of examples/case_study_power.py: docs/case_study_power.md from its tables (split off
to keep each file short; run the case study, not this file)."""

from __future__ import annotations

import numpy as np
import pandas as pd


# ----------------------------------------------------------------------------- page
def md(df: pd.DataFrame, digits: int = 4) -> str:
    def cell(v):
        if isinstance(v, (bool, np.bool_)):
            return str(bool(v))
        if isinstance(v, (float, np.floating)):
            return "nan" if not np.isfinite(v) else f"{v:.{digits}g}"
        return str(v)
    head = "| " + " | ".join(str(c).replace("|", "\\|") for c in df.columns) + " |"
    rule = "|" + "---|" * len(df.columns)
    return "\n".join([head, rule] + ["| " + " | ".join(cell(v) for v in row) + " |"
                                     for row in df.itertuples(index=False)])


IDEAL_COLS = ["layer", "iterate", "gamma_pred", "gamma_obs", "gamma_null", "mean_cos_pred", "mean_cos_obs",
              "consensus_angle_deg", "predicted_rate", "lambda1_is_complex",
              "rotation_theory_deg", "rotation_pred_deg", "rotation_obs_deg", "bipolarity_pred",
              "bipolarity_obs"]


def write_page(args, syn, ideal, recorded, steer_table, caps, seconds, modes=None) -> None:
    last, first = steer_table.iloc[-1], steer_table.iloc[0]
    unsteered = syn[syn.model == "unsteered"].iloc[0]
    rate_gaps = "; ".join(
        f"{r['model']}: {r['observed rate (last step)']:.3g} vs {r['predicted rate']:.3g} "
        f"({(r['observed rate (last step)'] / r['predicted rate'] - 1):+.0%})"
        for _, r in syn.iterrows())
    n_below = int((syn["observed rate (last step)"] < syn["predicted rate"]).sum())
    differ = modes[~modes["same mode"]] if modes is not None else None
    modes_block = "" if modes is None else (
        "Which mode leads depends on the ordering. F_t ordered by |lambda| and I + F_t ordered by "
        "|1 + lambda| (the matrix the idealised update iterates) pick different leading modes in "
        f"{len(differ)} of {len(modes)} layers"
        + ("" if differ.empty else " (" + ", ".join(
            f"layer {int(r['layer'])}: lambda_1 of F = {r['lambda1 of F']}, |1 + lambda_1| = "
            f"{r['|1+lambda1(F)|']:.2f}, while |mu_1| of I + F = {r['|mu1| (I+F)']:.2f}"
            for _, r in differ.iterrows()) + "; the two leading subspaces have cosine "
           f"{differ['max cos(B_F, B_I+F)'].min():.2f}-{differ['max cos(B_F, B_I+F)'].max():.2f})")
        + ". The table above uses I + F's ordering throughout (`iterate` column): B_t, the rates, "
        "the complex flag and the theory angle all belong to I + F's leading mode.\n\n"
        + md(modes) + "\n")
    bias_note = ""
    if first["idealised (one FFN-free step)"] < first["after attention + LN1"] - 0.05:
        bias_note = (": this is why one FFN-free step from the same tokens aligns less than "
                     f"MiniLM's attention half at gap {first['target gap']:g} "
                     f"({first['idealised (one FFN-free step)']:.3f} vs "
                     f"{first['after attention + LN1']:.3f}): the bias adds to the push at a given alpha; "
                     "at larger alpha both saturate and the idealised step overtakes LN1's cap")
    fin, ln1, ide = (last["final (after FFN + LN2)"], last["after attention + LN1"],
                     last["idealised (one FFN-free step)"])
    steered = syn[syn.model != "unsteered"]
    rate_lines = "\n".join(
        f"- {r['model']}: predicted {r['predicted rate']:.3g} per layer, observed "
        f"{r['observed rate (last step)']:.3g} at the last layer above rounding; alignment "
        f"{r['gamma layer 1']:.6f} after layer 1, {r['gamma layer 2']:.9f} after layer 2"
        for _, r in steered.iterrows())
    one_sided = sorted([caps["LN1+FFN+LN2 ceiling (+u)"], caps["LN1+FFN+LN2 ceiling (-u)"]])
    between = (" — the observed value lies between the two one-sided ceilings"
               if one_sided[0] <= fin <= one_sided[1] else "")
    finals = steer_table["final (after FFN + LN2)"]
    saturation = ("" if len(steer_table) < 2 else
                  f"Raising alpha cannot pass these ceilings: from gap {steer_table['target gap'].iloc[0]:g} "
                  f"to {steer_table['target gap'].iloc[-1]:g} (alpha "
                  f"{steer_table.alpha.iloc[-1] / steer_table.alpha.iloc[0]:.0f} times larger) the final "
                  f"alignment stays within {finals.min():.3f}-{finals.max():.3f}. ")
    ratio = ideal.gamma_obs / ideal.gamma_null
    lift = f"{ratio.min():.2f}-{ratio.max():.2f}"
    far = f"{ideal.angle_pred_principal_deg.min():.0f}-{ideal.angle_pred_principal_deg.max():.0f}"
    cl = ideal[ideal.lambda1_is_complex].layer.tolist()
    complex_layers = f" (layers {', '.join(map(str, cl))})" if cl else ""
    real = ideal[~ideal.lambda1_is_complex]
    poles = ("" if real.empty or real.bipolarity_obs.mean() <= real.bipolarity_pred.mean() else
             "Where lambda_1 is real (layers " + ", ".join(map(str, real.layer)) + ") the "
             "idealised tokens sit on one side of v_1 (bipolarity "
             + ", ".join(f"{b:.2f}" for b in real.bipolarity_pred) + ") while MiniLM's split "
             "between +v_1 and -v_1 (bipolarity " + ", ".join(f"{b:.2f}" for b in real.bipolarity_obs)
             + "). ")
    rec_block = ("" if recorded is None else
                 "Idealised dynamics with MiniLM's *recorded* attention patterns (per head, "
                 "captured by `instrument(model, capture=[..., 'attn_pattern'])` under eager "
                 "attention, `analyze(idealised={'attention': 'recorded'})`) instead of "
                 "uniform ones:\n\n"
                 + md(recorded[IDEAL_COLS]) + "\n")
    mode = "`--quick` (small synthetic model, one steering gap with alpha given)" if args.quick \
        else "the full run"
    text = f"""# Case study: the power-method view, what it predicts and where MiniLM departs

*Generated by `examples/case_study_power.py` ({mode}, {seconds:.0f} s); rerun it to refresh every
number and figure on this page.* Source: C. Li, C. Altafini, "Analogies between Transformer Layers
and Power Method" (2026). Column definitions: [metrics.md#idealised](metrics.md#idealised).

Paper 1 idealises an attention layer as one step of the power method: without FFN, with every
head attending uniformly and tokens L2-normalised after the residual add,
X <- N(X + F X A^T) with F = sum_h W_O^h W_V^h. With bidirectional uniform attention the mean
token is power-iterated by I + F (rate |mu_2/mu_1|, mu = 1 + lambda) and the deviations from it
shrink by 1/|mu_1| per layer, so each token's angle to v_1 contracts by
max(|mu_2|, 1)/|mu_1| per layer (`token_rate`). Steering (a rank-1 edit W_O' = W_O + alpha u w^T
making F' = F + alpha u u_r^T, u_r the part of u that W_V reaches: all of it here) shrinks that
rate to about the target gap; its eigenvector v_1 is within `min_cos` (0.9) of u, not u itself.

## (a) A synthetic FFN-free shared-weight model: the predicted rate is the asymptotic one

One 4-head attention layer (d = {16 if args.quick else 64}, no bias, random W_V, W_O with
entries N(0, 1/d)), applied {6 if args.quick else 12} times with shared weights,
uniform attention (all scores zero), tokens L2-normalised after each residual add; random start
tokens and a random unit direction u. The model is a plain `torch.nn.Module` (attention computed
head by head); the prediction comes from the spectrum of I + F' alone. Rows: the layer unsteered,
then steered by `rank1_output_edit(W_V, W_O, u, gap=g)` for g = 0.1, 0.01, 0.001.

{md(syn)}

![synthetic](img/case_power_synthetic.png)

Steering drives the alignment with v_1 of I + F' (which is u to |cos(v1, u)| above) to 1, and the
per-layer contraction of the tokens' tan(angle) approaches the predicted rate:

{rate_lines}

The predicted rate is an asymptotic one (the limit of the per-layer contraction as the slower
mode takes over); the last measurable step is not that limit: observed vs predicted, {rate_gaps}.
The deviations from the mean token contract at 1/|mu_1| and the mean at |mu_2/mu_1|; until the
slower of the two dominates, a step contracts by a mixture of both (and, for a
non-normal I + F, by the transient of its non-orthogonal eigenvectors), so the measured rate
differs from the asymptotic one: below it in {n_below} of {len(syn)} rows. With gap 0.01 and
0.001 the tokens reach rounding level
(tan ~ 1e-12 .. 1e-16) within 3-6 layers, so only the first few steps are measurable and the
gap-0.001 step stays {(steered.iloc[-1]['observed rate (last step)'] / steered.iloc[-1]['predicted rate'] - 1):+.0%}
off. The unsteered layer (gap {unsteered["gap |l2/l1| of F'"]:.3f}) aligns slowly: its last step
contracts by {unsteered["observed rate (last step)"]:.3f} against the asymptotic
{unsteered["predicted rate"]:.3f}, which {6 if args.quick else 12} layers do not reach. The theory is the spectrum's
statement about the limit; the transient is what a finite depth shows.

## (b) MiniLM-L6: the real model against its own idealisation

`probe.analyze(idealised=True)` runs the idealised dynamics with MiniLM's own F_t from the tokens
that entered layer 0 (the embeddings after their LayerNorm) and compares, per layer, with the
residual stream the model produced ({int(ideal.n_tokens.iloc[0])} tokens,
{int(ideal.n_sequences.iloc[0])} sentences). Every spectral column (B_t, the rates, the complex flag,
the theory angle) is I + F_t's leading mode, the section's one ordering (`iterate` column;
`idealised={{"iterate": "F"}}` would use F_t's, as the power section does by default).

{md(ideal[IDEAL_COLS])}

{rec_block}
{modes_block}
![layers](img/case_power_minilm_layers.png)

The idealised dynamics predicts consensus: the predicted tokens' mean pairwise cosine climbs to
{ideal.mean_cos_pred.iloc[-1]:.2f} by the last layer, while MiniLM's stays at
{ideal.mean_cos_obs.iloc[-1]:.2f}; the predicted mean token direction and the observed one are
{ideal.consensus_angle_deg.min():.0f}-{ideal.consensus_angle_deg.max():.0f} degrees apart. The observed
alignment gamma_t is at the level of the random-direction null (gamma_obs / gamma_null =
{lift}), the idealised one above it. The leading eigenvalue of I + F_t is complex in
{int(ideal.lambda1_is_complex.sum())} of {len(ideal)} layers{complex_layers}; there the idealised step would turn the
mean token by |arg(1 + lambda_1)| per layer inside that plane (`rotation_theory_deg`), and the
real model's mean token turns by other amounts (`rotation_obs_deg`); the idealised mean does not
follow the theory either within 6 layers, being still {far} degrees from B_t
(`angle_pred_principal_deg`). {poles}Per-layer
predicted rates |mu_2/mu_1| of I + F_t are {ideal.predicted_rate.min():.2f}-{ideal.predicted_rate.max():.2f}:
even the idealisation converges slowly in 6 layers.

### Steering MiniLM's last layer toward u

`sh.steer(model, u, gap=g)` on layer 5 (u random, seed 0). Alignment = mean |cos(x_i, u)| of the
final tokens (all tokens of all sentences).

{md(steer_table)}

Limits as alpha -> infinity (every token's attention output becomes c_i u with |c_i| -> infinity),
computed from MiniLM's own LayerNorm and FFN weights (the last two columns: the two parts of the
edit's push, see 3. below, not limits):

{md(pd.DataFrame([caps]))}

![steering](img/case_power_minilm_steering.png)

**Why MiniLM caps near 0.8 while the idealised model reaches 1.** In the idealised layer the
steered token x + c u, normalised, tends to +-u: alignment {ide:.3f} after one FFN-free step at
gap {last['target gap']:g}. MiniLM's block is post-LN with an FFN:
h = LN1(x + attn(x)), out = LN2(h + FFN(h)).
1. *Post-LN.* LN1 removes the mean over coordinates and rescales each coordinate by its gain and
   adds its bias: LN1(x + c u) -> g * z(u) + b, z the standardised u. Centering alone costs little
   (cos {caps['centering alone']:.4f}); the gains and biases cap the attention half at
   {caps['LN1 ceiling (+u)']:.3f} (+u) / {caps['LN1 ceiling (-u)']:.3f} (-u); observed {ln1:.3f}.
2. *FFN.* Every token now holds the same vector h* (up to sign); the FFN adds FFN(h*), which is
   not along u, and LN2 renormalises: the ceiling drops to {caps['LN1+FFN+LN2 ceiling (+u)']:.3f}
   (+u) / {caps['LN1+FFN+LN2 ceiling (-u)']:.3f} (-u); observed {fin:.3f}, with
   {last['share of tokens at +u']:.0%} of the final tokens on the +u side{between}.
3. *Biases.* The edit W_O' = W_O + alpha u w^T also multiplies the value bias: every token gets
   alpha u (w^T V x_attn + w^T b_V), and here w^T b_V = {caps['w^T b_V (value-bias push)']:.3f}
   against a token part |w^T V x| of {caps['mean abs w^T V x (token part)']:.3f} on average (before
   attention averages it). The idealisation keeps F only, no biases{bias_note}.
{saturation}The power-method picture holds for the attention
sub-layer (its residual update aligns with u as predicted); the post-LN normalisation and the FFN,
which the idealisation leaves out, set the ceiling.

## What this does not show

- The MiniLM rows use {int(ideal.n_sequences.iloc[0])} short sentences; the numbers are a
  description of this input, not a population estimate.
- The synthetic model uses bidirectional uniform attention; causal uniform attention (the
  section's choice for decoder models) has no closed-form rate here.
- `analyze(idealised=True)` uses uniform attention; the recorded-attention variant above uses
  the patterns the model computed (capture point `attn_pattern`, TransformerLens
  `hook_pattern`; it needs eager attention), and equals a hand-written float64 loop of the
  iteration with those patterns (`tests/analysis/test_idealised_recorded.py`).
"""
    (args.out / "case_study_power.md").write_text(text, encoding="utf-8")
    print(f"wrote {args.out / 'case_study_power.md'}")
