"""Section ``power`` of the power-method view: per layer, F_t's spectrum and gap, token alignment
with its principal subspace, consensus; ``cross_power``: the same from the weights alone for the
cross-attention F of a decoder stack (encoder-decoder models). ``rho_pvalue_adj``: the
Benjamini-Hochberg adjustment of ``rho_pvalue`` over the layers of the table (one family per
table).

    >>> import spectral_hooks as sh
    >>> from transformers import GPT2Config, GPT2Model
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4))
    >>> probe = sh.instrument(model)
    >>> _ = model(torch.arange(6)[None])
    >>> probe.analyze(power=True, progress=False).power[["layer", "truncated"]].values.tolist()
    [[0, False], [1, False]]
    >>> probe.remove()

Every layer's spectrum takes the route of :func:`spectral_hooks.metrics.spectrum.power_route`
(dense eig, exact from the factors, or top-k by Krylov), the one rule the training events
(:mod:`spectral_hooks.integrations.power_log`) follow too: they build each row from
:func:`layer_power_input`, ``metrics.spectrum.layer_spectrum`` and ``metrics.power.power_row``,
as the table here does.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union, cast

import pandas as pd
import torch
from torch import Tensor

from ..anatomy.weights import (
    LayerFactors,
    LayerOperators,
    krylov_dtype,
    layer_matrices,
    layer_operators,
)
from ..errors import OptionError
from ..linalg import LinearOperator
from ..linalg.operators import DenseOperator
from ..metrics.power import power_columns, power_table
from ..metrics.spectrum import (
    BATCHED_EIG_DEVICES,
    TOP_K,
    LayerSpectrum,
    checked_matrices,
    layer_spectra,
    layer_spectrum,
    power_route,
    power_spectrum_options,
    power_threads,
)
from ..metrics.stats import with_adjusted
from . import progress
from .finite import check_layer_matrices_finite
from .options import AnalyzeOptions
from .subject import Subject

#: p-value columns, Benjamini-Hochberg adjusted over the layers of the table (``*_adj``)
PVALUES = ("rho_pvalue",)
#: |Im lambda| <= REAL_TOL |lambda| counts as a real eigenvalue (``metrics.spectrum.spectrum``)
REAL_TOL = 1e-9


def layer_matrices_of(subject: Subject, *, fold_norm: bool, on_device: bool = False) -> Tensor:
    """F_t of every layer (float64; on the CPU, or with ``on_device`` on the model's device
    where it has float64 and batched eig, metrics.spectrum.BATCHED_EIG_DEVICES), computed once
    per state of the weights."""
    device = torch.device("cpu")
    if on_device and subject.anatomy.ov_layers:
        weight = subject.anatomy.layers[subject.anatomy.ov_layers[0]].output_weights()
        if weight.device.type in BATCHED_EIG_DEVICES:
            device = weight.device

    def compute() -> Tensor:
        F = layer_matrices(subject.anatomy, fold_norm=fold_norm, device=device)
        check_layer_matrices_finite(F, subject.power_layers)
        return F
    return subject.memo(("F", fold_norm, str(device)), compute)


def layer_power_input(factors: LayerFactors, *, full: Optional[bool], k: int
                      ) -> Union[Tensor, LinearOperator]:
    """Layer F_t in the form its route (``metrics.spectrum.power_route``) computes from (from
    ``factors`` in any dtype: only what is built is converted, to float64 where the device has
    it): the formed d x d matrix (float64, CPU) for "dense", else its thin factors (a LowRankOperator:
    exact from the r x r matrix B A for "factored", top-k by Krylov on B A for "krylov"),
    except where the factors are as wide as F (r = d: Krylov's products by the formed F cost
    2 d^2 flops against 4 d^2): that matrix as a DenseOperator, on the factors' device.

        >>> from spectral_hooks.anatomy.weights import LayerFactors
        >>> W_O, W_V = torch.randn(4, 16, 2, dtype=torch.float64), torch.randn(1, 2, 16, dtype=torch.float64)
        >>> factors = LayerFactors(0, W_O, W_V.expand(4, 2, 16), None)   # 4 heads share one W_V
        >>> type(layer_power_input(factors, full=None, k=8)).__name__   # r = 2 < d = 16
        'LowRankOperator'
        >>> layer_power_input(factors, full=True, k=8).shape
        torch.Size([16, 16])
    """
    r = factors.inner_width()
    route = power_route(factors.d_model, r if full is None else factors.d_model, full=full, top_k=k)
    dtype = krylov_dtype(factors.W_O.device)  # float64 where the device has it
    if route == "dense":
        return factors.matrix(dtype).to("cpu", torch.float64)
    op = factors.operator(dtype)
    if route == "krylov" and r >= factors.d_model:  # no thinner matrix than F: form it
        return DenseOperator(op.left @ op.right, name=f"F[{factors.layer}]")  # r, not H d_head
    return op


def layer_power_spectrum(factors: LayerFactors, *, iterate: str = "F",
                         full: Optional[bool] = None, k: int = TOP_K) -> LayerSpectrum:
    """One layer's spectrum as the power table computes it (same route, same arguments of
    ``metrics.spectrum.layer_spectrum``; B and B2, not every eigenvector): what a training
    event computes per layer.

        >>> from spectral_hooks.anatomy.weights import LayerFactors
        >>> W = torch.diag(torch.tensor([3.0, 1.0, 0.5], dtype=torch.float64))[None]
        >>> layer_power_spectrum(LayerFactors(0, W, torch.eye(3, dtype=torch.float64)[None], None)).gap_ratio
        0.3333333333333333
    """
    with power_threads():  # F may be formed here: on the threads of the spectrum
        F = layer_power_input(factors, full=full, k=k)
        return layer_spectrum(F, iterate, REAL_TOL, top_k=k, layer=factors.layer, vectors=False,
                              **power_spectrum_options(factors.d_model, full=full))


class PowerLayers:
    """The stack the power view computes from when some layer is not dense: ``F[t]`` is
    :func:`layer_power_input` of layer t (built when asked), ``shape`` (L, d, d).

        >>> from transformers import GPT2Config, GPT2Model
        >>> from spectral_hooks import anatomy_of
        >>> anatomy = anatomy_of(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)))
        >>> F = PowerLayers(layer_operators(anatomy), full=False, k=8)
        >>> F.shape, type(F[1]).__name__   # r = d: Krylov multiplies by the formed F
        ((2, 32, 32), 'DenseOperator')
    """

    def __init__(self, operators: LayerOperators, *, full: Optional[bool], k: int) -> None:
        self.operators: LayerOperators = operators
        self.full: Optional[bool] = full
        self.k: int = k
        self.shape: tuple[int, int, int] = operators.shape
        self.ndim: int = 3

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, t: int) -> Union[Tensor, LinearOperator]:
        return layer_power_input(self.operators.factors(t, convert=False), full=self.full, k=self.k)


@power_threads()  # layer_operators, the widths (torch.equal of heads), a dense stack formed
def power_matrices_of(subject: Subject, options: AnalyzeOptions) -> Union[Tensor, PowerLayers]:
    """What the power view's spectra are computed from: the dense F_t stack (float64, on the
    model's device where it has batched eig) where every layer has an OV map and takes the
    "dense" route (``metrics.spectrum.power_route``), else a :class:`PowerLayers` (no d x d
    matrix formed for a "factored" or "krylov" layer; a layer without an OV map never read)."""
    po = options.power_options
    d = subject.anatomy.d_model
    operators = subject.memo(("F_operators", options.fold_norm), lambda: layer_operators(
        subject.anatomy, fold_norm=options.fold_norm))
    if po.full is None:
        widths = subject.memo(("F_widths",), lambda: [
            operators.inner_width(t) for t in subject.anatomy.ov_layers])
    else:
        widths = [d]  # the route does not depend on them
    every_layer = len(subject.anatomy.ov_layers) == subject.anatomy.n_layers
    if every_layer and all(power_route(d, r, full=po.full, top_k=po.k) == "dense"
                           for r in widths):
        return layer_matrices_of(subject, fold_norm=options.fold_norm, on_device=True)
    # a hybrid stack's layers without an OV map are never read: one operator per layer
    return subject.memo(("F_power_layers", options.fold_norm, po.full, po.k),
                        lambda: PowerLayers(operators, full=po.full, k=po.k))


def spectrum_options(subject: Subject, options: AnalyzeOptions) -> dict[str, Any]:
    """``dense_limit`` / ``top_k`` under which ``metrics.spectrum.layer_spectrum`` takes each
    layer's route, given :func:`power_matrices_of`'s stack."""
    po = options.power_options
    return {"top_k": po.k, **power_spectrum_options(subject.anatomy.d_model, full=po.full)}


def spectra_by_layer(subject: Subject, options: AnalyzeOptions, F: Tensor,
                     layers: Sequence[int]) -> None:
    """With a progress display on: F's spectra computed (``metrics.spectrum.layer_spectra``,
    several layers at once where torch has several threads), each layer a step of the
    display's ``F`` pool as it is done, into the spectrum cache that the power and spectra
    tables then read them from (``metrics.power.spectra_table``: same F object, same options). Nothing
    where that cache does not hold them (an inference tensor) or where the layers run in one
    batched eig on the device (BATCHED_EIG_DEVICES): the table computes them as before."""
    display = progress.current()
    if display is None or not display.enabled:
        return
    if isinstance(F, Tensor) and (F.is_inference() or F.device.type in BATCHED_EIG_DEVICES):
        return
    kw = spectrum_options(subject, options)
    steps = progress.layers(layers, "F spectra", work="F")  # a step as each layer is done
    next(steps, None)
    layer_spectra(F, checked_matrices(F), list(layers), options.iterate, REAL_TOL,
                  kw["dense_limit"], kw["top_k"], done=lambda t: next(steps, None))


def has_cross_attention(subject: Subject) -> bool:
    """Whether any layer of the stack has a cross-attention (a decoder of an encoder-decoder)."""
    return any(part.cross_value is not None for part in subject.anatomy.layers)


def cross_power_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """``power``'s columns for F_t = sum_h W_O^h W_V^h of each decoder block's cross-attention.
    Its values read the encoder output, not this stack's tokens: the token columns are NaN."""
    def compute() -> pd.DataFrame:
        F = subject.memo(("F_cross",),
                         lambda: layer_matrices(subject.anatomy, attention="cross"))
        return with_adjusted(power_table(F, None, None, iterate=options.iterate,
                                         layers=list(subject.layers)), PVALUES)
    return subject.memo(("cross_power", options.iterate), compute)


def power_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """The ``power`` table of ``subject``: per analysed layer, ``metrics.power.power_table``'s
    row (every spectrum on its ``power_route``) plus the BH-adjusted p-values (``PVALUES``);
    OptionError for a ``power.direction`` or ``power.reference_layer`` that does not fit."""
    def compute() -> pd.DataFrame:
        # the metrics take either form: [L, d, d] or a stack of layer operators (duck-typed)
        F = cast(Tensor, power_matrices_of(subject, options))
        po = options.power_options
        direction = None
        if po.direction is not None:
            if len(po.direction) != subject.anatomy.d_model:
                raise OptionError("power.direction", f"a vector of length {len(po.direction)}",
                                  f"a vector of length d_model = {subject.anatomy.d_model}")
            direction = torch.tensor(po.direction, dtype=torch.float64)
        L = subject.anatomy.n_layers
        if po.reference_layer is not None and not -L <= po.reference_layer < L:
            raise OptionError("power.reference_layer", po.reference_layer,
                              f"a layer index in [-{L}, {L})")
        layers = subject.power_layers
        if not layers:  # no softmax attention in the recorded layers (a Mamba-2 stack)
            empty = pd.DataFrame(columns=list(power_columns(direction=direction is not None)))
            return empty.assign(**{f"{name}_adj": pd.Series(dtype=float) for name in PVALUES})
        reference = po.reference_layer
        if reference is None and subject.anatomy.ov_layers[-1] != L - 1:
            reference = subject.anatomy.ov_layers[-1]  # the last layer with an OV map
        spectra_by_layer(subject, options, F, list(layers))
        with power_threads():  # the tokens' copies too
            table = power_table(F, subject.tokens("resid_pre"), subject.tokens("resid_post"),
                                iterate=options.iterate, layers=list(layers),
                                reference_layer=reference, direction=direction,
                                real_tol=REAL_TOL, **spectrum_options(subject, options))
        return with_adjusted(table, PVALUES)
    return subject.memo(("power", options.iterate, options.fold_norm,
                         options.power_options), compute)
