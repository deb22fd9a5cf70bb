"""The columns of every report section the library produces: name, dtype, meaning, doc anchor.

    >>> SCHEMAS["power"].column("gap_ratio").meaning
    'r_t = |mu_2| / |mu_1|; smaller = a stronger pull'
    >>> "gamma_u" in SCHEMAS["power"].required   # only with power.direction
    False

Data only. Each column's ``anchor`` is the heading in ``docs/metrics.md`` that defines it
(``tests/test_columns_documented.py`` checks that every column is documented there and that
the reports saved before the rebuild, ``tests/golden/saved/``, validate against these schemas).
"""

from __future__ import annotations

from functools import partial

from ..anatomy.mixers import MIXERS, MLPS
from ..metrics.bottleneck import VARIANTS
from ..report.schema import Column, SectionSchema, register_schemas

__all__ = ["SCHEMAS", "VARIANTS", "JACOBIAN_VARIANTS", "LAYER_KINDS"]

#: ``jacobian``'s labels of its ``variant`` column: the first two of ``bottleneck``'s
#: (``metrics.bottleneck.VARIANTS``).
JACOBIAN_VARIANTS = VARIANTS[:2]

_power = partial(Column, anchor="power")
_spectra = partial(Column, anchor="spectra")
_shared = partial(Column, anchor="shared_weights")
_ideal = partial(Column, anchor="idealised")
_jacobian = partial(Column, anchor="jacobian")
_trends = partial(Column, anchor="trends")
_bottleneck = partial(Column, anchor="bottleneck")
_propagation = partial(Column, anchor="propagation")
_topology = partial(Column, anchor="topology")
_units = partial(Column, anchor="units")
_communities = partial(Column, anchor="communities")
_reinit_test = partial(Column, anchor="reinit_test")
_ADJ = "Benjamini-Hochberg adjusted "

#: The kind of the block a row's ``layer`` names, read off ``anatomy.layers[layer]`` (each
#: column is named after its ``LayerParts`` field), right after ``layer`` in every section whose
#: ``layer`` is one block. Optional: the reports saved before them have neither.
LAYER_KINDS = (
    Column("mixer", "category", f"what mixes tokens in block `layer`: one of {', '.join(MIXERS)}"
           " (anatomy.mixers); missing where a registered anatomy does not say", "layer_kinds",
           optional=True, nullable=True, categories=MIXERS),
    Column("mlp", "category", f"block `layer`'s MLP: one of {', '.join(MLPS)} (anatomy.mixers); "
           "missing where a registered anatomy does not say", "layer_kinds", optional=True,
           nullable=True, categories=MLPS),
)

POWER = SectionSchema("power", (
    _power("layer", "int", "layer index t (0 = first block)"),
    *LAYER_KINDS,
    _power("iterate", "category", "the matrix iterated: F, or I+F (mu = 1 + lambda orders the "
           "spectrum and defines gap and subspace)", categories=("F", "I+F")),
    _power("lambda1_real", "float", "real part of lambda_1, the eigenvalue of F_t of largest modulus"),
    _power("lambda1_imag", "float", "imaginary part of lambda_1"),
    _power("abs_lambda1", "float", "|lambda_1|"),
    _power("abs_lambda2", "float", "|lambda_2|, the first eigenvalue that is not the conjugate of lambda_1"),
    _power("abs_mu1", "float", "|mu_1| of the ordering quantity (mu = lambda for F, 1 + lambda for I+F)"),
    _power("abs_mu2", "float", "|mu_2| of the ordering quantity"),
    _power("gap_ratio", "float", "r_t = |mu_2| / |mu_1|; smaller = a stronger pull"),
    _power("gap_diff", "float", "|mu_1| - |mu_2|: the gap as a difference (same ordering)"),
    _power("lambda1_is_complex", "bool", "lambda_1 belongs to a complex conjugate pair"),
    _power("subspace_dim", "int", "dimension of the principal subspace B_t (1, or 2 for a pair)"),
    _power("gamma_in", "float", "mean alignment of the input tokens (resid_pre) with B_t"),
    _power("gamma", "float", "mean alignment of the output tokens (resid_post) with B_t"),
    _power("gamma_null", "float", "expected alignment of a uniformly random direction with B_t"),
    _power("lift", "float", "gamma / gamma_null"),
    _power("gamma2_dim", "int", "dimension of B2_t, the span of the top two eigen-directions (2 to 4)"),
    _power("gamma2_in", "float", "mean alignment of the input tokens with B2_t"),
    _power("gamma2", "float", "mean alignment of the output tokens with B2_t"),
    _power("gamma2_null", "float", "expected alignment of a random direction with B2_t"),
    _power("rho", "float", "share of tokens whose alignment with B_t grew through the layer"),
    _power("rho_pvalue", "float", "one-sided exact binomial p-value of rho against 1/2"),
    _power("rho_pvalue_adj", "float", _ADJ + "rho_pvalue (family: the layers of the table)"),
    _power("n_tokens", "int", "number of non-padding tokens used"),
    _power("mean_cos", "float", "mean pairwise cosine of the output tokens (consensus)"),
    _power("collapse_residual", "float", "||X - 1 xbar^T||_F / ||X||_F of the output tokens"),
    _power("erank", "float", "effective rank of the output token matrix"),
    _power("ref_layer", "int", "the one fixed reference layer r (power.reference_layer; default "
           "the model's last layer)"),
    _power("gamma_ref", "float", "mean alignment of the output tokens with B_r of the reference "
           "layer (a single global eigenvector would keep it high at every depth)"),
    _power("gamma_ref_null", "float", "expected alignment of a random direction with B_r"),
    _power("subspace_cos_ref", "float", "cosine of the smallest principal angle between B_t and B_r"),
    _power("gamma_u", "float", "mean |cos(x, u)| of the output tokens with power.direction u "
           "(e.g. a steering direction); only with power.direction", optional=True),
    _power("truncated", "bool", "only the top eigenvalues of F_t were computed (d above the dense limit)"),
    _power("n_computed", "int", "number of eigenvalues of F_t computed (d when not truncated)"),
    _power("converged", "bool", "False only when the Krylov eigensolver did not converge"),
), key_columns=("layer",))

SPECTRA = SectionSchema("spectra", (
    _spectra("source", "category", "F (layer matrix F_t) or jacobian (token Jacobian J_l)",
             categories=("F", "jacobian")),
    _spectra("layer", "int", "layer index (the block of F_t or of J_l)"),
    *LAYER_KINDS,
    _spectra("position", "int", "token position of the Jacobian; -1 for F (not a position)"),
    _spectra("index", "int", "rank of the eigenvalue by modulus, 0 = largest"),
    _spectra("real", "float", "real part of the eigenvalue"),
    _spectra("imag", "float", "imaginary part of the eigenvalue"),
    _spectra("abs", "float", "modulus of the eigenvalue"),
    _spectra("truncated", "bool", "rows of F: only the top eigenvalues were computed; missing on "
             "Jacobian rows; absent without power=True", nullable=True, optional=True),
    _spectra("converged", "bool", "rows of F: the eigensolver converged; missing on Jacobian rows;"
             " absent without power=True", nullable=True, optional=True),
), key_columns=("source", "layer", "position", "index"))

SHARED_WEIGHTS = SectionSchema("shared_weights", (
    _shared("layer", "int", "application t of the shared layer (0 = first); no mixer/mlp "
            "columns: every row is the one shared block applied again, whose kind the "
            "report's metadata (layer_mixers, layer_mlps) gives"),
    _shared("angle_pred_obs_deg", "float", "angle (degrees) between the predicted and the observed "
            "mean token direction"),
    _shared("predicted_rate", "float", "|mu_2 / mu_1| of I + F, the predicted convergence rate"),
    _shared("angle_obs_principal_deg", "float", "angle (degrees) of the observed mean direction to "
            "the principal subspace of I + F"),
    _shared("angle_pred_principal_deg", "float", "angle (degrees) of the predicted direction to the "
            "principal subspace of I + F"),
    _shared("abs_mu1", "float", "|mu_1|, mu = 1 + lambda"),
    _shared("abs_mu2", "float", "|mu_2|"),
    _shared("mu1_is_complex", "bool", "mu_1 belongs to a complex conjugate pair"),
    _shared("n_tokens", "int", "number of non-padding tokens used"),
    _shared("group", "int", "index of the shared-weight group (one per shared block)"),
), key_columns=("layer",))

IDEALISED = SectionSchema("idealised", (
    _ideal("layer", "int", "layer index t (0 = first block)"),
    *LAYER_KINDS,
    _ideal("attention", "category", "the attention pattern of the prediction: uniform (the "
           "paper's idealisation) or recorded (each head's recorded attention probabilities, "
           "capture point attn_pattern)", categories=("uniform", "recorded")),
    _ideal("iterate", "category", "the ordering that picks B_t, as in power",
           categories=("F", "I+F")),
    _ideal("n_tokens", "int", "number of non-padding tokens"),
    _ideal("n_sequences", "int", "number of sequences (attention mixes tokens of one sequence)"),
    _ideal("gamma_pred", "float", "mean alignment with B_t of the predicted tokens after layer t"),
    _ideal("gamma_obs", "float", "mean alignment with B_t of the observed output tokens (= power's gamma)"),
    _ideal("gamma_null", "float", "expected alignment of a uniformly random direction with B_t"),
    _ideal("mean_cos_pred", "float", "mean pairwise cosine of the predicted tokens (consensus)"),
    _ideal("mean_cos_obs", "float", "mean pairwise cosine of the observed output tokens"),
    _ideal("consensus_angle_deg", "float", "angle (degrees, lines) between the predicted and the "
           "observed mean token direction"),
    _ideal("angle_pred_principal_deg", "float", "angle (degrees) of the predicted mean token to B_t"),
    _ideal("angle_obs_principal_deg", "float", "angle (degrees) of the observed mean token to B_t"),
    _ideal("predicted_rate", "float", "|mu_2 / mu_1| of I + F_t: the rate of the mean token's "
           "power iteration"),
    _ideal("token_rate", "float", "max(|mu_2|, 1) / |mu_1|: the predicted per-layer contraction "
           "of a token's angle to v_1 (uniform bidirectional attention)"),
    _ideal("rate_pred", "float", "tan(angle to B_t) after / before layer t of the predicted mean token"),
    _ideal("rate_obs", "float", "the same ratio for the observed mean token (resid_pre -> resid_post)"),
    _ideal("frac_plus_pred", "float", "share of predicted tokens on the +v_1 side (v_1 with its "
           "largest entry positive; NaN for a complex pair)"),
    _ideal("frac_plus_obs", "float", "share of observed output tokens on the +v_1 side"),
    _ideal("bipolarity_pred", "float", "1 - |mean cos(x_i, v_1)| / mean |cos(x_i, v_1)| of the "
           "predicted tokens: 0 unipolar, 1 an even split between +v_1 and -v_1"),
    _ideal("bipolarity_obs", "float", "the same for the observed output tokens"),
    _ideal("lambda1_is_complex", "bool", "lambda_1 belongs to a complex conjugate pair"),
    _ideal("rotation_theory_deg", "float", "|arg(1 + lambda_1)| in degrees: the angle I + F_t "
           "turns its leading plane per step (NaN for a real lambda_1)"),
    _ideal("rotation_pred_deg", "float", "angle the predicted mean token turned in that plane "
           "through layer t"),
    _ideal("rotation_obs_deg", "float", "angle the observed mean token turned in that plane "
           "through layer t"),
), key_columns=("layer",))

JACOBIAN = SectionSchema("jacobian", (
    _jacobian("variant", "category", "trained, or init (a fresh initialisation of the same config)",
              categories=JACOBIAN_VARIANTS),
    _jacobian("layer", "int", "block index l"),
    *LAYER_KINDS,
    _jacobian("position", "int", "token position p of the Jacobian (a row of the recording)"),
    _jacobian("sample", "int", "the batch row (sequence) the position belongs to (option sample)"),
    _jacobian("token_id", "int", "the token id at (sample, position); -1 where the model was "
              "called with embeddings"),
    _jacobian("token", "str", "the token's text (tokenizer.decode); empty without a tokenizer"),
    _jacobian("top_eig_abs", "float", "modulus of the largest eigenvalue of J"),
    _jacobian("frac_complex_top*_null_se", "float", "Monte Carlo standard error of "
              "frac_complex_top{k}_null"),
    _jacobian("frac_complex_top*_null", "float", "frac_complex_top{k} of a real Gaussian d x d "
              "matrix (Monte Carlo; NaN above the on-demand size limit)"),
    _jacobian("frac_complex_top*", "float", "share of complex eigenvalues among the top-k of J by "
              "modulus (k + 1 when a conjugate pair straddles k); both computations"),
    _jacobian("mean_abs_angle_top*", "float", "sum |lambda| |arg lambda| / sum |lambda| over the "
              "complex eigenvalues of the top-k of J (radians)"),
    _jacobian("frac_negative_top*", "float", "share of real negative eigenvalues (reflections) "
              "among the top-k of J"),
    _jacobian("self_alignment_top*", "float", "(1/k) ||U_k^T V_k||_F^2 of the top-k singular "
              "subspaces of Delta J"),
    _jacobian("frac_complex", "float", "share of all d eigenvalues of J that are complex (exact "
              "computation only)", optional=True),
    _jacobian("frac_complex_null", "float", "the same share for a real Gaussian matrix of the same "
              "size (Edelman-Kostlan-Shub; exact computation only)", optional=True),
    _jacobian("mean_abs_angle", "float", "sum |lambda| |arg lambda| / sum |lambda| over the "
              "complex eigenvalues of J (radians; exact computation only)", optional=True),
    _jacobian("frac_negative", "float", "share of real negative eigenvalues of J (reflections; "
              "exact computation only)", optional=True),
    _jacobian("sym_energy", "float", "||S||_F^2 / ||Delta J||_F^2, S the symmetric part of Delta J"),
    _jacobian("sym_energy_se", "float", "standard error of the Hutchinson estimate of sym_energy "
              "(0 when exact)"),
    _jacobian("commutator", "float", "||Delta J^T Delta J - Delta J Delta J^T||_F / "
              "||Delta J||_F^2 (non-normality; 0 = normal)"),
    _jacobian("commutator_se", "float", "standard error of the Hutchinson estimate of commutator "
              "(0 when exact)"),
    _jacobian("departure", "float", "Henrici departure from normality sqrt(||J||_F^2 - sum "
              "|lambda_i|^2) (exact computation only)", optional=True),
    _jacobian("departure_rel", "float", "departure / ||Delta J||_F (exact computation only)",
              optional=True),
    _jacobian("departure_rel_upper_top*_se", "float", "standard error of the Hutchinson estimate "
              "of departure_rel_upper_top{k} (0 when exact)"),
    _jacobian("departure_rel_upper_top*", "float", "upper bound of departure_rel: sqrt(2 (||K||_F^2 "
              "- sum over the top-k of (Im lambda)^2)) / ||Delta J||_F, K = (J - J^T)/2; exact "
              "when every other eigenvalue is real"),
    _jacobian("departure_rel_lower", "float", "lower bound of departure_rel (Eberlein): ||C||_F / "
              "(sqrt(6) ||Delta J - (tr Delta J / d) I||_F ||Delta J||_F), C the commutator",
              optional=True),
    _jacobian("departure_rel_lower_se", "float", "standard error of the Hutchinson estimate of "
              "departure_rel_lower (0 when exact)", optional=True),
    _jacobian("n_matvecs", "int", "Jacobian-vector products spent"),
    _jacobian("k", "int", "number of top eigenvalues / singular values asked for"),
    _jacobian("n_eigenvalues", "int", "number of eigenvalues computed (k, k + 1 for a conjugate "
              "pair, d dense)"),
    _jacobian("d", "int", "size of J (d_model)"),
    _jacobian("dense", "bool", "the exact computation was used (J materialised, dense linear "
              "algebra); False: matrix-free"),
    _jacobian("converged", "bool", "False when an eigs/svds run did not converge"),
), key_columns=("variant", "layer", "position"))

TRENDS = SectionSchema("trends", (
    _trends("metric", "str", "a per-layer metric of the power or jacobian table"),
    _trends("spearman_rho", "float", "Spearman correlation of the metric with the layer index"),
    _trends("pvalue", "float", "its two-sided p-value"),
    _trends("pvalue_adj", "float", _ADJ + "pvalue (family: every metric of the table)"),
    _trends("n_layers", "int", "layers with a finite value (positions averaged per layer)"),
), key_columns=("metric",))

BOTTLENECK = SectionSchema("bottleneck", (
    _bottleneck("variant", "category", "trained, init, symmetric or schur", categories=VARIANTS),
    _bottleneck("ablated_layer", "int", "the one layer ablated (causal models, full depth), or "
                "-1: every layer (or none, for trained and init)"),
    _bottleneck("depth", "int", "l, the number of blocks in the product P_l"),
    _bottleneck("erank", "float", "effective rank of P_l (of its top n_singular singular "
                "values where truncated)"),
    _bottleneck("participation_ratio", "float", "(sum sigma^2)^2 / sum sigma^4 (over the top "
                "n_singular where truncated: a lower bound)"),
    _bottleneck("stable_rank", "float", "sum sigma^2 / sigma_1^2 (over the top n_singular where "
                "truncated: a lower bound)"),
    _bottleneck("surviving", "int", "#{sigma_i >= 1e-2 sigma_1} (where truncated: min(that, "
                "n_singular))"),
    _bottleneck("sigma_max", "float", "sigma_1, the largest singular value of P_l"),
    _bottleneck("n_singular", "int", "number of singular values the ranks use"),
    _bottleneck("truncated", "bool", "erank, participation_ratio, stable_rank and surviving are "
                "those of the top n_singular singular values only, not of P_l's full spectrum"),
    _bottleneck("erank_est", "float", "matrix-free rows: SLQ estimate of the effective rank over "
                "all d singular values of P_l", optional=True),
    _bottleneck("erank_est_se", "float", "its standard error (over the probes)", optional=True),
    _bottleneck("erank_est_lo", "float", "erank of the probe means under each probe's "
                "Gauss-Radau rule at 0: the lower end of the quadrature bracket", optional=True),
    _bottleneck("erank_est_hi", "float", "erank under the Gauss rules, the upper end: the exact "
                "erank lies in [lo, hi] up to a few erank_est_se (erank_est: the midpoint rule)",
                optional=True),
    _bottleneck("surviving_est", "float", "matrix-free rows: SLQ estimate of #{sigma_i >= 1e-2 "
                "sigma_1} over all d singular values", optional=True),
    _bottleneck("surviving_est_se", "float", "its standard error (over the probes)", optional=True),
    _bottleneck("surviving_est_lo", "float", "probe mean of the lower end of each probe's "
                "quadrature bracket (Chebyshev-Markov-Stieltjes) of surviving_est", optional=True),
    _bottleneck("surviving_est_hi", "float", "probe mean of the upper end of that bracket: the "
                "exact count lies in [lo, hi] up to surviving_est_se", optional=True),
    _bottleneck("n_matvecs", "int", "operator applications spent on this variant up to this depth"),
    _bottleneck("computation", "category", "end_to_end: P_l by JVPs through the whole stack "
                "(bidirectional models, trained/init); product: J_l ... J_1 of per-position "
                "blocks (exact for causal models; the symmetric/schur ablations)",
                categories=("end_to_end", "product")),
), key_columns=("variant", "ablated_layer", "depth"))

PROPAGATION = SectionSchema("propagation", (
    _propagation("layer", "int", "layer l the perturbation goes through (x_{l+1} = J_l x_l)"),
    *LAYER_KINDS,
    _propagation("norm", "float", "||x_{l+1}||"),
    _propagation("growth", "float", "||x_{l+1}|| / ||x_l||"),
    _propagation("alignment_top", "float", "||U_k^T x_{l+1}|| / ||x_{l+1}||, U_k the top-k left "
                 "singular vectors of J_l"),
    _propagation("alignment_in", "float", "||V_k^T x_l|| / ||x_l||, V_k the top-k right singular vectors"),
    _propagation("alignment_null", "float", "the same alignment for a uniformly random direction"),
    _propagation("k", "int", "number of singular directions k"),
), key_columns=("layer",))

TOPOLOGY = SectionSchema("topology", (
    _topology("layer", "int", "layer l whose input h_l is the unit graph"),
    *LAYER_KINDS,
    _topology("n_communities", "int", "number of communities"),
    _topology("modularity", "float", "modularity Q of the partition"),
    _topology("method", "category", "leiden (signed) or louvain (on |weight|)",
              categories=("leiden", "louvain")),
    _topology("coupling_rho", "float", "Spearman correlation of bridge score and amplification"),
    _topology("coupling_pvalue", "float", "its two-sided p-value"),
    _topology("coupling_pvalue_adj", "float", _ADJ + "coupling_pvalue (family: the layers)"),
    _topology("coupling_rho_init", "float", "the same at initialisation (control)"),
    _topology("coupling_pvalue_init", "float", "its two-sided p-value (NaN without reinit)"),
    _topology("coupling_pvalue_init_adj", "float", _ADJ + "coupling_pvalue_init (family: the "
              "layers)"),
    _topology("coupling_rho_shuffled", "float", "the same with community labels shuffled (control)"),
    _topology("coupling_pvalue_shuffled", "float", "two-sided empirical p-value of coupling_rho "
              "against the label shuffles"),
    _topology("coupling_pvalue_shuffled_adj", "float", _ADJ + "coupling_pvalue_shuffled (family: "
              "the layers)"),
    _topology("bridge_gain_rho", "float", "Spearman rho of bridge score vs the signed gain "
              "log ||J e_i||: > 0 bridges amplified, < 0 suppressed, relative to other units"),
    _topology("bridge_gain_pvalue", "float", "two-sided p-value of bridge_gain_rho"),
    _topology("bridge_gain_pvalue_adj", "float", _ADJ + "bridge_gain_pvalue (family: the layers)"),
    _topology("bridge_gain_rho_init", "float", "the same at initialisation (NaN without reinit)"),
    _topology("bridge_gain_pvalue_init", "float", "two-sided p-value of bridge_gain_rho_init"),
    _topology("bridge_gain_pvalue_init_adj", "float", _ADJ + "bridge_gain_pvalue_init (family: "
              "the layers)"),
    _topology("bridge_gain_rho_vs_init", "float", "Spearman rho of bridge score vs the paired "
              "change log_gain - log_gain_init: what training did to bridges (NaN without reinit)"),
    _topology("bridge_gain_pvalue_vs_init", "float", "two-sided p-value of bridge_gain_rho_vs_init"),
    _topology("bridge_gain_pvalue_vs_init_adj", "float", _ADJ + "bridge_gain_pvalue_vs_init "
              "(family: the layers)"),
    _topology("bridge_log_gain", "float", "mean signed gain log ||J e_i|| of the bridges (bridge "
              "score in the top 10%): < 0 suppressed, > 0 amplified"),
    _topology("bridge_log_gain_init", "float", "the same at initialisation (NaN without reinit)"),
    _topology("n_units", "int", "number of units d"),
    _topology("n_tokens", "int", "number of recorded tokens the correlations use"),
), key_columns=("layer",))

UNITS = SectionSchema("units", (
    _units("layer", "int", "layer l"),
    *LAYER_KINDS,
    _units("unit", "int", "index of the residual-stream coordinate"),
    _units("community", "int", "its community label"),
    _units("bridge_score", "float", "participation coefficient over |weights|"),
    _units("amplification", "float", "g_i = ||Delta J e_i|| (the residual-free part: >= 0, unsigned)"),
    _units("amplification_se", "float", "standard error of amplification: 0 where exact (dense), the "
           "Hutchinson estimate's (delta method) where matrix-free; NaN where amplification is"),
    _units("log_gain", "float", "signed gain log ||J e_i|| of the whole block: > 0 amplifies the "
           "unit, < 0 suppresses it"),
    _units("log_gain_se", "float", "standard error of log_gain: 0 where exact (dense), the "
           "Hutchinson estimate's (delta method) where matrix-free; NaN where log_gain is"),
    _units("log_gain_init", "float", "the same in the freshly initialised model (NaN without "
           "reinit)"),
    _units("log_gain_init_se", "float", "standard error of log_gain_init: 0 where exact (dense), the "
           "Hutchinson estimate's (delta method) where matrix-free; NaN where log_gain_init is"),
    _units("log_gain_attn", "float", "signed gain log ||J_attn e_i|| of the attention sublayer "
           "x -> resid_mid (topology={'sublayers': True}; NaN otherwise)", optional=True),
    _units("log_gain_attn_se", "float", "standard error of log_gain_attn: 0 where exact (dense), the "
           "Hutchinson estimate's (delta method) where matrix-free; NaN where log_gain_attn is", optional=True),
    _units("log_gain_attn_init", "float", "the same at initialisation (NaN without reinit)",
           optional=True),
    _units("log_gain_attn_init_se", "float", "standard error of log_gain_attn_init: 0 where exact (dense), the "
           "Hutchinson estimate's (delta method) where matrix-free; NaN where log_gain_attn_init is", optional=True),
    _units("log_gain_ffn", "float", "signed gain log ||J_ffn e_i|| of the feed-forward "
           "sublayer resid_mid -> output (topology={'sublayers': True}; NaN otherwise)",
           optional=True),
    _units("log_gain_ffn_se", "float", "standard error of log_gain_ffn: 0 where exact (dense), the "
           "Hutchinson estimate's (delta method) where matrix-free; NaN where log_gain_ffn is", optional=True),
    _units("log_gain_ffn_init", "float", "the same at initialisation (NaN without reinit)",
           optional=True),
    _units("log_gain_ffn_init_se", "float", "standard error of log_gain_ffn_init: 0 where exact (dense), the "
           "Hutchinson estimate's (delta method) where matrix-free; NaN where log_gain_ffn_init is", optional=True),
), key_columns=("layer", "unit"))

COMMUNITIES = SectionSchema("communities", (
    _communities("layer", "int", "layer l"),
    *LAYER_KINDS,
    _communities("community", "int", "community label (as in units)"),
    _communities("layer_type", "category", "block: the gain of the whole block Jacobian; "
                 "attention / ffn: of that sublayer (topology={'sublayers': True})",
                 categories=("block", "attention", "ffn")),
    _communities("n_units", "int", "number of units in the community"),
    _communities("mean_log_gain", "float", "mean of log ||J e_i|| over the community (> 0 "
                 "amplified, < 0 suppressed)"),
    _communities("mean_log_gain_null", "float", "mean of mean_log_gain over label shuffles (null)"),
    _communities("mean_log_gain_null_sd", "float", "its standard deviation over the shuffles"),
    _communities("gain_pvalue", "float", "two-sided empirical p-value of mean_log_gain against "
                 "the label shuffles"),
    _communities("gain_pvalue_adj", "float", _ADJ + "gain_pvalue (family: every layer x "
                 "community row)"),
    _communities("mean_log_gain_init", "float", "the same units' mean gain at initialisation "
                 "(control; NaN without reinit)"),
    _communities("gain_init_pvalue", "float", "the label-shuffle test of mean_log_gain_init"),
    _communities("gain_init_pvalue_adj", "float", _ADJ + "gain_init_pvalue (family: every row)"),
    _communities("amplification", "float", "||Delta J Pi_C||_F^2 / |C|"),
    _communities("gain_coupling_rho", "float", "Spearman correlation of bridge score and log_gain "
                 "within the community"),
    _communities("gain_coupling_pvalue", "float", "its two-sided p-value"),
    _communities("gain_coupling_pvalue_adj", "float", _ADJ + "gain_coupling_pvalue (family: "
                 "every row)"),
    _communities("mean_log_gain_se_bound", "float", "upper bound of mean_log_gain's standard "
                 "error: the mean of its units' log_gain_se (0 where exact)"),
    _communities("mean_log_gain_init_se_bound", "float", "the same for mean_log_gain_init"),
    _communities("amplification_se_bound", "float", "the same for amplification, from the "
                 "units' errors of ||Delta J e_i||^2"),
), key_columns=("layer",))

REINIT_TEST = SectionSchema("reinit_test", (
    _reinit_test("metric", "category", "sym_energy, commutator, departure_rel or "
                 "erank_end_to_end", categories=("sym_energy", "commutator", "departure_rel",
                                                 "erank_end_to_end")),
    _reinit_test("layer", "int", "layer l (erank_end_to_end: the end-to-end Jacobian through "
                 "l); no mixer/mlp columns: an erank_end_to_end row is the product of blocks "
                 "0..l, not block l"),
    _reinit_test("trained", "float", "the trained model's value"),
    _reinit_test("init_mean", "float", "mean over the re-initialised models"),
    _reinit_test("init_std", "float", "their standard deviation (ddof 1)"),
    _reinit_test("n_init", "int", "number of re-initialised models with a finite value"),
    _reinit_test("difference", "float", "trained - init_mean"),
    _reinit_test("greater_pvalue", "float", "(1 + #{init >= trained}) / (n + 1)"),
    _reinit_test("greater_pvalue_adj", "float", _ADJ + "greater_pvalue (family: every row)"),
    _reinit_test("less_pvalue", "float", "(1 + #{init <= trained}) / (n + 1)"),
    _reinit_test("less_pvalue_adj", "float", _ADJ + "less_pvalue (family: every row)"),
    _reinit_test("two_sided_pvalue", "float", "min(1, 2 min(greater_pvalue, less_pvalue))"),
    _reinit_test("two_sided_pvalue_adj", "float", _ADJ + "two_sided_pvalue (family: every row)"),
    _reinit_test("t_stat", "float", "single-case (Crawford-Howell) t of trained against the init "
                 "sample"),
    _reinit_test("t_pvalue", "float", "its two-sided p-value (n - 1 degrees of freedom)"),
    _reinit_test("t_pvalue_adj", "float", _ADJ + "t_pvalue (family: every row)"),
    _reinit_test("dense", "bool", "exact computation (dense Jacobians / end-to-end products)"),
), key_columns=("metric", "layer"))

_jsum = partial(Column, anchor="jacobian_summary")
JACOBIAN_SUMMARY = SectionSchema("jacobian_summary", (
    _jsum("variant", "category", "trained, or init (reinit=True)", categories=("trained", "init")),
    _jsum("layer", "int", "layer l"),
    *LAYER_KINDS,
    _jsum("metric", "str", "a float column of the jacobian table (standard errors left out)"),
    _jsum("mean", "float", "mean of the metric over every row of the layer: samples x positions"),
    _jsum("sd_samples", "float", "standard deviation (ddof 1) across samples of each sample's "
          "mean over its positions; NaN for one sample"),
    _jsum("se_samples", "float", "sd_samples / sqrt(n_samples): standard error of the mean over "
          "samples"),
    _jsum("n_samples", "int", "samples (batch rows) with a finite value"),
    _jsum("n_rows", "int", "rows (samples x positions) with a finite value"),
), key_columns=("variant", "metric", "layer"))

#: ``power``'s columns for the cross-attention F of a decoder stack (docs/metrics.md, power).
CROSS_POWER = SectionSchema("cross_power", POWER.columns, key_columns=POWER.key_columns)

#: Every section the library produces, by name.
SCHEMAS: dict[str, SectionSchema] = {
    s.name: s
    for s in (POWER, CROSS_POWER, SPECTRA, SHARED_WEIGHTS, IDEALISED, JACOBIAN, JACOBIAN_SUMMARY,
              TRENDS, BOTTLENECK,
              PROPAGATION, TOPOLOGY, UNITS, COMMUNITIES, REINIT_TEST)
}

register_schemas(SCHEMAS.values())  # the report's HTML glossary describes saved reports too
