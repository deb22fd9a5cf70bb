"""Layers across processes: ``probe.analyze(..., distributed=True)`` under torch.distributed.

    >>> import os, tempfile
    >>> import torch.distributed as dist
    >>> tmp = tempfile.TemporaryDirectory()
    >>> rendezvous = "file://" + os.path.join(tmp.name, "rendezvous")
    >>> dist.init_process_group("gloo", init_method=rendezvous, rank=0, world_size=1)  # torchrun's job
    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> report = probe.analyze(jacobian={"k": 4}, distributed=True)   # on every rank
    >>> report.jacobian["layer"].tolist()                             # every layer, every rank
    [0, 1]
    >>> dist.destroy_process_group(); tmp.cleanup()

The contract (decided here, documented in docs and RESULTS.md):

- **One recording.** Every rank analyses its *own* recording, which must be the one every other
  rank made: the same weights, run on the same inputs (e.g. rank 0 broadcasts the batch before
  the forward, or every rank reads the same file). Nothing is shipped between ranks but a
  checksum: before any work, the ranks compare a CRC of the recorded tensors (states, masks,
  token ids, statistics), of a strided sample of the weights and of the options, and all raise
  :class:`~spectral_hooks.errors.RecordingError` together when they differ (a collective check:
  a mismatch cannot hang). Broadcasting rank 0's recording (block inputs included) is not done:
  the captured block-call arguments are arbitrary model-specific objects.
- **Layers split round-robin.** Rank r analyses recorded layers ``layers[r::world]`` (the cost of
  a block is about the same at every depth, so this balances; ``spectra`` splits all of the
  model's layers the same way). Sections split: ``power``, ``cross_power``, ``spectra``,
  ``jacobian``; ``trends`` is recomputed from the gathered tables. ``bottleneck``, ``topology``
  and ``reinit`` need every layer's operator on one rank and are refused with ``distributed``.
- **Every rank gets the same report.** The tables are computed eagerly (a collective cannot wait
  for a lazy read on one rank), gathered with ``all_gather_object`` (pickled DataFrames: small),
  and merged into exactly the single-process order. The metadata's ``distributed`` entry holds
  the world size, each rank's layers and its compute time. Gathering to all ranks, not just rank
  0, lets the same script run unchanged on every rank (no ``if report is not None``).

Results equal a single-process run's bit for bit when each rank uses the same number of threads
as that run (every random draw is seeded per layer, never per rank).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import replace
from typing import Any, Optional

import pandas as pd
import torch

from ..errors import OptionError, RecordingError
from ..metrics.stats import with_adjusted
from ..report import Report
from .cache import WeightsFingerprint
from .options import AnalyzeOptions
from .power import power_section
from .subject import Subject

#: sections each rank computes for its share of the layers (the rest are derived or refused)
SPLIT_SECTIONS = ("power", "cross_power", "spectra", "jacobian")
WHOLE_SECTIONS = ("shared_weights",)  # not per layer: rank 0 computes it, the others take it
NOT_SPLIT = ("bottleneck", "topology", "reinit", "reinit_seeds", "idealised")


def _dist():
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise OptionError("distributed", True, "False outside torch.distributed",
                          hint="call torch.distributed.init_process_group on every rank first")
    return dist


def _crc(tensor: Any, crc: int) -> int:
    if tensor is None:
        return zlib.crc32(b"none", crc)
    t = tensor.detach().to("cpu").contiguous()
    crc = zlib.crc32(repr((tuple(t.shape), str(t.dtype))).encode(), crc)
    if t.is_floating_point() and t.element_size() == 2:  # numpy has no bfloat16
        t = t.view(torch.int16)
    return zlib.crc32(t.reshape(-1).numpy().tobytes(), crc)


def recording_checksum(subject: Subject, options: AnalyzeOptions) -> int:
    """A CRC of what this rank would analyse: recorded tensors, weights sample, options."""
    rec = subject.recording
    crc = zlib.crc32(repr((rec.layers, rec.capture, rec.store, len(rec.steps),
                           options.to_dict())).encode())
    present = [(capture, layer) for capture in rec.capture for layer in rec.layers
               if rec.has(capture, layer)]  # a hybrid's Mamba layer has no attn_out
    if rec.store == "stats":
        for capture, layer in present:
            stats = rec.stats(capture, layer)
            crc = _crc(stats.cov, _crc(stats.mean, zlib.crc32(str(stats.count).encode(), crc)))
    else:
        crc = _crc(rec.token_ids, _crc(rec.mask, crc))
        for capture, layer in present:
            crc = _crc(rec.tensor(capture, layer), crc)
    for sample in WeightsFingerprint(subject.model)()[1]:
        crc = zlib.crc32(sample if isinstance(sample, bytes) else
                         sample.cpu().numpy().tobytes(), crc)
    return crc


def _check_same(subject: Subject, options: AnalyzeOptions, group: Any) -> None:
    dist = _dist()
    crc = float(recording_checksum(subject, options))  # < 2**32: exact in float64
    both = torch.tensor([crc, -crc], dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        both = both.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    if float(both[0]) != -float(both[1]):
        raise RecordingError(
            "distributed=True analyses one recording, and the ranks' recordings (or weights, or "
            "options) differ: run the same model on the same inputs on every rank (e.g. "
            "broadcast the batch from rank 0) before probe.analyze(distributed=True)")


def _merge(name: str, frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The ranks' pieces in single-process order: by layer (by source, then layer, for
    ``spectra``: F's rows come before the Jacobian's); rows of one layer keep their order."""
    frames = [f for f in frames if f is not None and len(f.columns)]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    if "layer" not in df.columns or df.empty:
        return df
    keys = pd.DataFrame({"layer": df["layer"].to_numpy()})
    if name == "spectra" and "source" in df.columns:
        sources = list(dict.fromkeys(["F", *df["source"].tolist()]))
        keys.insert(0, "source", df["source"].map(sources.index).to_numpy())
    order = keys.sort_values(list(keys.columns), kind="stable").index
    return df.loc[order].reset_index(drop=True)


def _trends(tables: dict, options: AnalyzeOptions) -> pd.DataFrame:
    from .trends import trends_of

    jacobian = tables["jacobian"]
    jac = jacobian[jacobian["variant"] == "trained"] if "variant" in jacobian else jacobian
    return trends_of(jac, tables["power"], options.jacobian_options.k)


def _readjusted(name: str, table: pd.DataFrame) -> pd.DataFrame:
    """BH adjustments over the whole gathered table: each rank adjusted only its own layers."""
    from .power import PVALUES
    return with_adjusted(table, PVALUES) if name in ("power", "cross_power") else table


def analyze_distributed(subject: Subject, options: AnalyzeOptions, *,
                        group: Optional[Any] = None, distributed: Any = True) -> Report:
    """Split the layers of ``subject`` over the ranks of ``group`` (default: the world), compute
    this rank's share, gather every table on every rank. A collective: every rank calls it."""
    from . import analyze  # the package's analyze (this module is imported by it lazily)

    if distributed is not True:
        raise OptionError("distributed", distributed, "True or False")
    dist = _dist()
    refused = [name for name in NOT_SPLIT if getattr(options, name)]
    if refused:
        raise OptionError("distributed", True, f"False when {', '.join(refused)} is on",
                          hint="distributed=True splits power, spectra, jacobian and trends; "
                               "bottleneck, topology, reinit, reinit_seeds and idealised need every "
                               "layer on one rank")
    _check_same(subject, options, group)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    local = replace(subject, share=(rank, world),
                    namespace=(subject.namespace, "share", rank, world))
    start = time.perf_counter()
    report = analyze(local, options)
    unknown = [n for n in report.sections if n not in (*SPLIT_SECTIONS, *WHOLE_SECTIONS, "trends")]
    if unknown:  # every rank has the same options: all raise together, none hangs
        raise OptionError("distributed", True, f"False for the sections {unknown}",
                          hint="distributed=True knows how to split or gather only "
                               f"{(*SPLIT_SECTIONS, *WHOLE_SECTIONS, 'trends')}")
    names = [n for n in report.sections if n in SPLIT_SECTIONS]
    tables = {name: report[name] for name in names}
    if "trends" in report.sections and "power" not in tables:  # trends read power too
        tables["power"] = power_section(local, options)
    whole = {name: report[name] for name in report.sections
             if name in WHOLE_SECTIONS and rank == 0}
    mine = {"rank": rank, "layers": list(local.layers),
            "compute_s": round(time.perf_counter() - start, 4),
            "timings_s": report.metadata["timings_s"], "fallbacks": report.metadata["fallbacks"]}
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (tables, mine, whole), group=group)
    merged = {name: _readjusted(name, _merge(name, [g[0].get(name) for g in gathered]))
              for name in tables}
    merged.update(gathered[0][2])
    if "trends" in report.sections:
        merged["trends"] = _trends(merged, options)
    meta = report.metadata.replace(
        timings_s=dict(gathered[0][1]["timings_s"]),
        fallbacks=[f for g in gathered for f in g[1]["fallbacks"]],
        distributed={"world_size": world, "backend": str(dist.get_backend(group)),
                     "split": "round-robin over recorded layers",
                     "ranks": [g[1] for g in gathered]})
    schemas = report.schemas
    return Report({name: merged[name] for name in report.sections if name in merged}, meta,
                  schemas={n: s for n, s in schemas.items() if n in merged})
