"""Options of an analysis: frozen, keyword-only, validated when constructed.

    >>> AnalyzeOptions(jacobian=JacobianOptions(k=8), bottleneck=True).jacobian.k
    8
    >>> AnalyzeOptions.resolve(jacobian={"k": 8}).jacobian == JacobianOptions(k=8)
    True
    >>> JacobianOptions(k=0)
    Traceback (most recent call last):
    ...
    spectral_hooks.errors.OptionError: jacobian.k=0 is not valid: expected an int >= 1

Every error names the option, the bad value and what is valid. ``to_dict()`` is what a report's
metadata stores as its resolved options.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from ..checks import check_bool, check_choice, check_float, check_int
from ..errors import OptionError, OptionTypeError, UnknownOptionError
from ..metrics.spectrum import ITERATES, TOP_K
from .option_values import (
    checked_depths,
    checked_direction,
    checked_positions,
    checked_samples,
    known_options,
)

IDEALISED_ATTENTIONS = ("uniform", "recorded")
ABLATIONS = ("symmetric", "schur")


def _callers_level() -> int:
    """The ``stacklevel`` that names the first caller outside this package (a warning raised
    while options are made then points at the user's line, where Python shows it)."""
    package = __name__.split(".")[0]
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] \
            == package:
        frame, level = frame.f_back, level + 1
    return level


@dataclass(frozen=True, kw_only=True)
class JacobianOptions:
    """Options of the Jacobian view: ``analyze(jacobian=JacobianOptions(k=8))`` or
    ``analyze(jacobian={"k": 8})``.

        >>> JacobianOptions(positions=[0, 3]).positions
        (0, 3)

    Attributes:
        k: eigenvalues per block Jacobian (top by modulus).
        positions: "default" (the model's default position, ``anatomy.default_position``:
            the last real token of a text model, the CLS token of a ViT/DeiT/CLIP vision
            tower, the centre patch of a SigLIP one), "last" (the last real token of
            ``sample``), "all" (every real prefill token of ``sample``) or a list of
            recording rows.
        dense: None (automatic: exact where d_model <= DENSE_AUTO_MAX_D, a fixed threshold
            calibrated in benchmarks/dense_threshold.py; matrix-free above), True (force the
            exact, dense computation) or False (force matrix-free). Each row of the jacobian
            table says which was used (``dense``).
        sample: the batch row whose tokens are linearised.
        samples: None (only ``sample``), "all" (every recorded batch row) or a list of batch
            rows: the jacobian table gets rows for each of them (column ``sample``) and the
            ``jacobian_summary`` section averages every metric over samples and positions,
            with the spread across samples (sd and standard error of the per-sample means).
            The other sections (bottleneck, topology, trends) stay at ``sample``.
        n_samples: Hutchinson probes of the matrix-free estimators.
        seed: seeds every random draw (start vectors, probes, nulls, community detection).
        init_seed: the seed of the freshly initialised model (``reinit=True``).
        tol: eigensolver tolerance (relative residual); None follows the precision of the
            operator (1e-8 in float64, 1e-4 in float32).
        bottleneck_k: singular values kept per depth in matrix-free bottleneck products.
        bottleneck_dense: exact bottleneck products; None: exact up to SCHUR_MAX_D.
        bottleneck_probes: Rademacher probes of the SLQ estimates of the full-spectrum erank
            and surviving (``erank_est``, ``surviving_est`` and their ``_se``) in matrix-free
            bottleneck rows; 0: no estimates (the top-k ranks only).
        bottleneck_steps: Lanczos steps per probe of those estimates (capped at d_model).
        bottleneck_depths: the depths l the bottleneck ranks (P_l = J_l ... J_1): None (every
            one), "log2" (1, 2, 4, ... and the last layer's) or a list of depths. Matrix-free
            the depths run in lockstep, one sweep of L block products per solver step for all
            of them, a depth adding l columns to it: "log2" ranks log2(L) + 1 depths for under
            2L layer-depths of columns (32 layers: 6 depths, 63 of 528). The single-layer
            ablations run at full depth regardless.
        ablations: bottleneck ablations, any of "symmetric", "schur".
        progress: deprecated (a DeprecationWarning; forwarded for this release):
            ``analyze(progress=...)``, :attr:`AnalyzeOptions.progress`, is the one switch.
        group_layers: compute the layers' Jacobians together (True: layers of one block
            structure as one batched operator, ``linearize.group``; the same values as one by
            one, to solver tolerance), one layer at a time (False), or by the cost rule (None,
            the default: together unless an operator application costs FLOPs rather than
            dispatch, ``linalg.cost.flop_bound``: on the CPU from d_model =
            ``CPU_FLOP_BOUND_N``; on an accelerator always together).
        materialize: matrix-free rows computed from each block's J formed in 128-column
            products (True), from the operator (False), or by the cost rule (None, the
            default: formed where an application costs FLOPs, the CPU from d_model =
            ``CPU_FLOP_BOUND_N``, and d_model columns in 128-column products cost less than
            the Krylov runs would, ``analysis.jacobian.resolve_materialize``). The same
            values to solver tolerance (every eigenpair and singular triplet checked with
            fresh products of the operator); the report's ``jacobian`` metadata says which
            was used and why. Materialised layers run one at a time (``group_layers``
            None then means False; True with True is refused).
    """

    k: int = 16
    positions: Union[str, tuple[int, ...]] = "default"
    dense: Optional[bool] = None
    sample: int = 0
    samples: Union[None, str, tuple[int, ...]] = None
    n_samples: int = 64
    seed: int = 0
    init_seed: int = 1
    tol: Optional[float] = None
    bottleneck_k: int = 32
    bottleneck_dense: Optional[bool] = None
    bottleneck_probes: int = 16
    bottleneck_steps: int = 48
    bottleneck_depths: Union[None, str, tuple[int, ...]] = None
    ablations: tuple[str, ...] = ABLATIONS
    progress: Optional[bool] = None
    group_layers: Optional[bool] = None
    materialize: Optional[bool] = None

    def __post_init__(self) -> None:
        for name, minimum in (("k", 1), ("sample", 0), ("n_samples", 1), ("bottleneck_k", 1),
                              ("bottleneck_probes", 0), ("bottleneck_steps", 1)):
            check_int(f"jacobian.{name}", getattr(self, name), minimum=minimum)
        if self.bottleneck_probes == 1:
            raise OptionError("jacobian.bottleneck_probes", 1, "0 (no estimates) or an int >= 2",
                              hint="a standard error needs two probes")
        for name in ("seed", "init_seed"):
            check_int(f"jacobian.{name}", getattr(self, name))
        for name in ("dense", "bottleneck_dense", "progress", "group_layers", "materialize"):
            check_bool(f"jacobian.{name}", getattr(self, name), allow_none=True)
        if self.progress is not None:
            warnings.warn("jacobian.progress is deprecated: pass analyze(progress=...) (the one "
                          "progress switch, AnalyzeOptions.progress)", DeprecationWarning,
                          stacklevel=_callers_level())
        if self.materialize and self.group_layers:
            raise OptionError("jacobian.materialize", True, "False or None with group_layers=True",
                              hint="a layer group iterates on its batched operator: choose one")
        check_float("jacobian.tol", self.tol, above=0, below=1, allow_none=True)
        object.__setattr__(self, "positions", checked_positions(self.positions))
        object.__setattr__(self, "samples", checked_samples(self.samples))
        object.__setattr__(self, "bottleneck_depths", checked_depths(self.bottleneck_depths))
        ablations = (self.ablations,) if isinstance(self.ablations, str) else self.ablations
        ablations = tuple(ablations)
        unknown = [a for a in ablations if a not in ABLATIONS]
        if unknown:
            raise OptionError("jacobian.ablations", self.ablations, f"a subset of {ABLATIONS}")
        object.__setattr__(self, "ablations", ablations)

    @classmethod
    def resolve(cls, value: Any) -> Optional["JacobianOptions"]:
        """None/False: off; True: defaults; a dict or JacobianOptions: these options."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls(**known_options(cls, value, "jacobian"))
        raise OptionTypeError("jacobian", value,
                              "None, True, a dict of options or JacobianOptions")

    def to_dict(self) -> dict[str, Any]:
        """These options as JSON-able values (lists for tuples), as a report's metadata stores
        them.

        >>> stored = JacobianOptions(positions=[3]).to_dict()
        >>> stored["positions"] == [3]     # a list: JSON has no tuples
        True
        """
        out = dataclasses.asdict(self)
        del out["progress"]  # the display, not a result: AnalyzeOptions.progress
        out["positions"] = list(self.positions) if isinstance(self.positions, tuple) \
            else self.positions
        out["ablations"] = list(self.ablations)
        for name in ("samples", "bottleneck_depths"):
            if isinstance(getattr(self, name), tuple):
                out[name] = list(getattr(self, name))
        return out


_DEFAULT_JACOBIAN = JacobianOptions()

@dataclass(frozen=True, kw_only=True)
class PowerOptions:
    """Options of the power-method view: ``analyze(power={"full": True})``; ``power=True`` is
    ``PowerOptions()``.

        >>> PowerOptions(k=4).k
        4

    Attributes:
        full: None (automatic, per layer: every eigenvalue exactly from the r x r W_V W_O
            where F = W_O W_V has r (key/value heads x d_head) < d and r <= ``metrics.
            spectrum.FACTORED_EXACT_MAX`` or d_model < ``metrics.spectrum.MATRIX_FREE_D``
            (1024); else every eigenvalue of F where d_model < 1024, else the top ``k`` by
            ``linalg.eigs`` (on the r x r W_V W_O where r < d, else on F formed): the
            rule ``metrics.spectrum.power_route``, which the training events follow too), True
            (every eigenvalue) or False (top-k by ``linalg.eigs``); rows say which
            (``truncated``).
        k: eigenpairs of F computed matrix-free (at least 3 are always used).
        reference_layer: the one fixed layer r whose B_r every row's ``gamma_ref`` and
            ``subspace_cos_ref`` compare with (None: the model's last layer; negative ok).
        direction: a d_model vector u (e.g. a steering direction, ``edit.direction``): column
            ``gamma_u`` = mean |cos(x_i, u)| of each layer's output tokens (None: no such
            column). Stored as a tuple of floats.
    """

    full: Optional[bool] = None
    k: int = TOP_K
    reference_layer: Optional[int] = None
    direction: Optional[tuple[float, ...]] = None

    def __post_init__(self) -> None:
        check_bool("power.full", self.full, allow_none=True)
        check_int("power.k", self.k, minimum=1)
        check_int("power.reference_layer", self.reference_layer, allow_none=True)
        object.__setattr__(self, "direction", checked_direction(self.direction))

    @classmethod
    def resolve(cls, value: Any) -> Union[bool, "PowerOptions"]:
        """False: off; True: on with the defaults (kept as True); a dict or PowerOptions."""
        if isinstance(value, bool) or isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls(**known_options(cls, value, "power"))
        raise OptionTypeError("power", value, "True, False, a dict of options or PowerOptions")


@dataclass(frozen=True, kw_only=True)
class IdealisedOptions:
    """Options of the idealised dynamics: ``analyze(idealised={"attention": "recorded"})``;
    ``idealised=True`` is ``IdealisedOptions()``.

        >>> IdealisedOptions(attention="recorded").attention
        'recorded'

    Attributes:
        attention: "uniform" (the paper's idealisation: every head attends uniformly, over
            keys 0..i in a causal model) or "recorded" (each head's own recorded attention
            probabilities A_h, per layer and sequence: needs
            ``instrument(model, capture=[..., "attn_pattern"])`` on an eager-attention model).
        iterate: the one ordering of every spectral column of the table (B_t, the rates, the
            rotation angle, the poles): "I+F" (default: the matrix the idealised dynamics
            iterates, so the rates are its convergence rates) or "F" (the power section's
            default B_t). Independent of ``AnalyzeOptions.iterate``.
    """

    attention: str = "uniform"
    iterate: str = "I+F"

    def __post_init__(self) -> None:
        check_choice("idealised.attention", self.attention, IDEALISED_ATTENTIONS)
        check_choice("idealised.iterate", self.iterate, ITERATES)

    @classmethod
    def resolve(cls, value: Any) -> Union[bool, "IdealisedOptions"]:
        """False: off; True: on with the defaults (kept as True); a dict or IdealisedOptions."""
        if isinstance(value, bool) or isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls(**known_options(cls, value, "idealised"))
        raise OptionTypeError("idealised", value, "True, False, a dict of options (e.g. "
                              "{'attention': 'recorded'}) or IdealisedOptions")


_DEFAULT_IDEALISED = IdealisedOptions()


@dataclass(frozen=True, kw_only=True)
class TopologyOptions:
    """Options of the topology sections: ``analyze(topology={"sublayers": True})``;
    ``topology=True`` is ``TopologyOptions()``.

        >>> from spectral_hooks import TopologyOptions
        >>> TopologyOptions(sublayers=True).sublayers
        True

    Attributes:
        sublayers: also each unit's gain through the attention sublayer (x -> resid_mid) and
            the feed-forward one (resid_mid -> block output), and per community by layer type
            (sequential families only: ``anatomy/sublayers.py``; others are refused).
    """

    sublayers: bool = False

    def __post_init__(self) -> None:
        check_bool("topology.sublayers", self.sublayers)

    @classmethod
    def resolve(cls, value: Any) -> Union[bool, "TopologyOptions"]:
        """False: off; True: on with the defaults (kept as True); a dict or TopologyOptions."""
        if isinstance(value, bool) or isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls(**known_options(cls, value, "topology"))
        raise OptionTypeError("topology", value, "True, False, a dict of options (e.g. "
                              "{'sublayers': True}) or TopologyOptions")


@dataclass(frozen=True, kw_only=True)
class AnalyzeOptions:
    """What ``probe.analyze(...)`` computes. Each keyword of ``analyze`` is a field here.

        >>> AnalyzeOptions(iterate="I+F").to_dict()["iterate"]
        'I+F'

    Attributes:
        power: the power-method view (power, spectra and, for ALBERT, shared_weights): True,
            False, or its options (a dict or :class:`PowerOptions`: ``full``, ``k``).
        iterate: "F" or "I+F" (order eigenvalues by mu = 1 + lambda).
        fold_norm: multiply F by the gain of the norm that feeds attention.
        jacobian: the Jacobian view (jacobian, trends, and Jacobian rows in spectra).
        bottleneck: the end-to-end bottleneck and its ablations, and propagation.
        reinit: the same Jacobian analyses on a freshly initialised model, side by side.
        reinit_seeds: 0 (off) or n >= 2: section ``reinit_test``, the trained model's
            sym_energy, non-normality and end-to-end effective rank per layer against n models
            re-initialised with seeds ``jacobian.init_seed + i`` (empirical and t-test
            p-values, Benjamini-Hochberg adjusted).
        topology: residual-unit communities, bridges and amplification: True, False, or its
            options (a dict or :class:`TopologyOptions`: ``sublayers``).
        idealised: paper 1's idealised dynamics (FFN-free, L2-normalised, the model's own
            per-head weights) from the recorded first-layer tokens, against the observation:
            True (uniform attention), False, or its options (a dict or
            :class:`IdealisedOptions`: ``attention`` "uniform" or "recorded").
        tokenizer: names the tokens of the Jacobian rows (column ``token``, decoded with its
            ``decode``); None uses the tokenizer the model carries (TransformerLens), if any.
        progress: one display over the whole analysis (``analysis/progress.py``): None or True
            shows it (a bar on a terminal, a line per layer elsewhere), False hides it, as
            does ``TQDM_DISABLE=1``. The deprecated ``jacobian.progress`` is moved here
            (where this is None) when the options are made.
    """

    power: Union[bool, PowerOptions] = True
    iterate: str = "F"
    fold_norm: bool = False
    jacobian: Optional[JacobianOptions] = None
    bottleneck: bool = False
    reinit: bool = False
    reinit_seeds: int = 0
    topology: Union[bool, TopologyOptions] = False
    idealised: Union[bool, IdealisedOptions] = False
    tokenizer: Any = None
    progress: Optional[bool] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "power", PowerOptions.resolve(self.power))
        object.__setattr__(self, "idealised", IdealisedOptions.resolve(self.idealised))
        object.__setattr__(self, "topology", TopologyOptions.resolve(self.topology))
        for name in ("fold_norm", "bottleneck", "reinit"):
            check_bool(name, getattr(self, name))
        seeds = "0 (off) or an int >= 2 (re-initialisations to test against)"
        if check_int("reinit_seeds", self.reinit_seeds, minimum=0, accepted=seeds) == 1:
            raise OptionError("reinit_seeds", 1, seeds)
        if self.tokenizer is not None and not callable(getattr(self.tokenizer, "decode", None)):
            raise OptionTypeError("tokenizer", self.tokenizer,
                                  "None or a tokenizer with a decode(ids) method")
        check_bool("progress", self.progress, allow_none=True)
        check_choice("iterate", self.iterate, ITERATES)
        jacobian = JacobianOptions.resolve(self.jacobian)
        if jacobian is not None and jacobian.progress is not None:  # deprecated: moved here
            if self.progress is None:
                object.__setattr__(self, "progress", jacobian.progress)
            jacobian = dataclasses.replace(jacobian, progress=None)
        object.__setattr__(self, "jacobian", jacobian)

    @classmethod
    def resolve(cls, options: Optional["AnalyzeOptions"] = None, **values: Any
                ) -> "AnalyzeOptions":
        """``analyze``'s keywords (or an AnalyzeOptions, with keywords overriding it)."""
        if options is not None and not isinstance(options, cls):
            raise OptionTypeError("options", options, "an AnalyzeOptions or None",
                                  hint="pass keywords instead: analyze(power=True, ...)")
        base = {} if options is None else {f.name: getattr(options, f.name)
                                           for f in dataclasses.fields(cls) if f.init
                                           and not f.name.startswith("_")}
        public = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        unknown = sorted(set(values) - public)
        if unknown:
            raise UnknownOptionError("analyze()", unknown, sorted(public))
        return cls(**{**base, **values})

    @property
    def power_options(self) -> PowerOptions:
        """The power options in force (the defaults when ``power`` is True or off)."""
        return self.power if isinstance(self.power, PowerOptions) else _DEFAULT_POWER

    @property
    def idealised_options(self) -> IdealisedOptions:
        """The idealised options in force (the defaults when ``idealised`` is True or off)."""
        return self.idealised if isinstance(self.idealised, IdealisedOptions) \
            else _DEFAULT_IDEALISED

    @property
    def topology_sublayers(self) -> bool:
        """Whether the topology sections split the gains by sublayer."""
        return isinstance(self.topology, TopologyOptions) and self.topology.sublayers

    @property
    def jacobian_view(self) -> bool:
        """Whether any Jacobian-based section is asked for."""
        return bool(self.jacobian is not None or self.bottleneck or self.reinit or self.topology
                    or self.reinit_seeds > 0)

    @property
    def jacobian_options(self) -> JacobianOptions:
        """The Jacobian options in force (the defaults when ``jacobian`` is off)."""
        return self.jacobian if self.jacobian is not None else _DEFAULT_JACOBIAN

    @property
    def show_progress(self) -> Optional[bool]:
        """The progress switch in force: ``progress`` (the deprecated ``jacobian.progress``
        is moved there when the options are made)."""
        return self.progress

    def to_dict(self) -> dict[str, Any]:
        """The options that shape results (not the progress display) as JSON-able values: a
        report's ``metadata["options"]``.

        >>> stored = AnalyzeOptions(jacobian={"k": 4}).to_dict()
        >>> stored["jacobian"].get("k")
        4
        """
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if not f.name.startswith("_") and f.name != "progress"}
        if isinstance(self.power, PowerOptions):
            out["power"] = dataclasses.asdict(self.power)
        for name in ("idealised", "topology"):
            if dataclasses.is_dataclass(getattr(self, name)):
                out[name] = dataclasses.asdict(getattr(self, name))
        out["jacobian"] = self.jacobian.to_dict() if self.jacobian is not None else None
        out["tokenizer"] = None if self.tokenizer is None else type(self.tokenizer).__name__
        if self.jacobian is None and self.jacobian_view:
            out["jacobian_defaults_used"] = self.jacobian_options.to_dict()
        return out


_DEFAULT_POWER = PowerOptions()
