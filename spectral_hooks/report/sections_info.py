"""What the HTML report says about each section: title, explanation, headline columns.

    >>> SECTION_INFO["power"][0]
    'Power-method view'
    >>> HEADLINES["trends"]
    ('metric', 'spearman_rho', 'n_layers')

Data only (no imports beyond the standard library): `spectral_hooks.report.tables` builds the
summary tables from `HEADLINES`, `spectral_hooks.report.html` shows `SECTION_INFO`. A section not
named here (one added by a later analysis) is shown generically from its column schema.
"""

from __future__ import annotations

__all__ = ["SECTION_INFO", "HEADLINES", "DERIVED_COLUMNS", "QUALIFIERS", "LABEL_COLUMNS"]

#: title, one-paragraph explanation, and anchor in docs/metrics.md for each known section.
SECTION_INFO: dict[str, tuple[str, str]] = {
    "power": ("Power-method view",
              "Each attention layer without its FFN acts like one step of the power method with the "
              "layer matrix F_t = Σ_h W_O^h W_V^h: it tilts tokens toward the principal eigen-direction "
              "of F_t. The gap ratio |λ₂|/|λ₁| says how strong that pull is; γ_in and γ measure how "
              "aligned the tokens are before and after the layer, against the alignment of random "
              "directions (the null), and ρ is the share of tokens whose alignment increased."),
    "cross_power": ("Cross-attention power view",
                    "The decoder stack of an encoder-decoder model: the spectrum of each block's "
                    "cross-attention matrix F_t = Σ_h W_O^h W_V^h, which maps the encoder output "
                    "into the decoder's residual stream (weights alone: token columns are empty)."),
    "spectra": ("Eigenvalues",
                "All (or the top-k) eigenvalues of the layer matrices F_t and of the token Jacobians, "
                "in long format, one row per eigenvalue; plotted in the complex plane in the "
                "power-method and Jacobian sections."),
    "shared_weights": ("Shared weights",
                       "For models that apply one layer repeatedly (ALBERT): the direction and rate "
                       "that the FFN-free power iteration x ← (I+F)x/‖(I+F)x‖ predicts, against the "
                       "consensus direction the recording shows, layer by layer."),
    "jacobian": ("Jacobian view",
                 "Each block is linearised at the recorded input: J_l is the Jacobian of the block "
                 "output at a token with respect to its input, and ΔJ = J − I its residual-free part. "
                 "Complex eigenvalues mean rotation, symmetric energy near 1 means a nearly symmetric "
                 "(gradient-like) map, departure from normality measures how far J is from having "
                 "orthogonal eigenvectors. Every rate is shown with its random-matrix null."),
    "trends": ("Depth trends",
               "Spearman rank correlation of each per-layer metric with the layer index, and its "
               "p-value: a monotone change through depth."),
    "bottleneck": ("End-to-end bottleneck",
                   "Ranks of the cumulative product P_l = J_l ⋯ J_1 at one token position: how many "
                   "directions survive l blocks. Compared across the trained model, a fresh "
                   "initialisation of the same config, and two ablations (symmetric part of each J, "
                   "Schur diagonal of each J, i.e. non-normality removed)."),
    "propagation": ("Perturbation propagation",
                    "A perturbation injected at one layer pushed through the chained Jacobians: its "
                    "growth or compression per layer and its alignment with the top singular "
                    "directions."),
    "topology": ("Topology of residual units",
                 "A graph of the residual-stream units of each layer (edges: strongest Pearson "
                 "correlations over tokens), split into communities. The coupling is the Spearman "
                 "correlation between a unit's bridge score (how evenly it links communities) and its "
                 "amplification by the block, with two controls: the same at initialisation, and with "
                 "community labels shuffled."),
    "units": ("Residual units",
              "Per layer and unit: community, bridge score (participation coefficient) and "
              "amplification ‖ΔJ e_i‖."),
}


#: The few columns of each section shown in its summary table (names or ``fnmatch`` patterns,
#: in display order). Each one brings its qualifiers along (`QUALIFIERS`: its null, standard
#: error, p-value, adjusted p-value, controls), placed right after it. Rows of a section with
#: several rows per key (positions of a layer, units of a layer) are averaged in the summary, by
#: variant: trained and init are never averaged together.
HEADLINES: dict[str, tuple[str, ...]] = {
    "power": ("layer", "abs_lambda1", "lambda1_is_complex", "gap_ratio", "gamma_in", "gamma",
              "lift", "rho"),
    "cross_power": ("layer", "abs_lambda1", "lambda1_is_complex", "gap_ratio"),
    "spectra": ("source", "layer", "n_eigenvalues", "max_abs", "frac_complex", "n_outside_unit"),
    "shared_weights": ("layer", "angle_pred_obs_deg", "predicted_rate", "angle_obs_principal_deg",
                       "abs_mu1", "abs_mu2"),
    "jacobian": ("variant", "layer", "frac_complex", "frac_complex_top*", "sym_energy",
                 "commutator", "departure_rel", "top_eig_abs"),
    "trends": ("metric", "spearman_rho", "n_layers"),
    "bottleneck": ("variant", "depth", "erank", "surviving", "stable_rank"),
    "propagation": ("layer", "growth", "alignment_top", "alignment_in"),
    "topology": ("layer", "n_communities", "modularity", "coupling_rho"),
    "units": ("layer", "bridge_score", "amplification"),
}

#: Columns that describe a row's layer rather than measure it (the kind of its block,
#: ``analysis.columns.LAYER_KINDS``): shown next to the key columns in every table part and
#: summary, never averaged.
LABEL_COLUMNS: tuple[str, ...] = ("mixer", "mlp")

#: Words that make a column a qualifier of another (``gamma_null`` qualifies ``gamma``,
#: ``rho_pvalue_adj`` qualifies ``rho``, ``coupling_rho_init`` qualifies ``coupling_rho``).
QUALIFIERS = frozenset({"null", "se", "pvalue", "adj", "init", "shuffled", "ci", "lo", "hi",
                        "lower", "upper"})

#: Columns the summary tables compute, with their meaning (shown in the glossary).
DERIVED_COLUMNS: dict[str, str] = {
    "n_rows": "number of rows of the full table averaged into this summary row (positions of "
              "a layer, units of a layer); every number of the row is their mean",
    "n_eigenvalues": "number of eigenvalues listed for this source and layer",
    "max_abs": "largest modulus |lambda| among them",
    "frac_complex": "share of them with |Im lambda| > 1e-6 |lambda| (complex conjugate pairs)",
    "n_outside_unit": "number of them outside the unit circle (|lambda| > 1)",
}
