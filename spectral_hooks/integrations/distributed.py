"""torch.distributed helpers: combine per-rank recordings into global statistics.

    >>> probe = sh.instrument(model, store="stats")        # on every rank   # doctest: +SKIP
    >>> for batch in my_shard: model(**batch)                                # doctest: +SKIP
    >>> stats = all_reduce_stats(probe.recording)          # same on every rank  # doctest: +SKIP
    >>> stats[("resid_post", 3)].mean, stats[("resid_post", 3)].cov         # doctest: +SKIP

Only the public ``recording.stats(capture, layer)`` (count, mean, unbiased covariance) is read.
Ranks are combined exactly with the pairwise (Chan et al.) update, as two sum-reductions:

    N = sum_r n_r,   mean = sum_r n_r mean_r / N,
    M2 = sum_r [ (n_r - 1) cov_r + n_r (mean_r - mean)(mean_r - mean)^T ],   cov = M2 / (N - 1)

which equals the statistics of one recording over all ranks' tokens (up to rounding; it avoids
the cancellation of the raw sum-of-outer-products formula). Everything is float64.
"""

from __future__ import annotations

import zlib
from typing import Any, Optional, Union

import torch

from ..recording import RunningStats


def _recording(obj: Any):
    return getattr(obj, "recording", obj)  # a Probe or a Recording


def all_reduce_stats(recording: Any, *, group: Optional[Any] = None,
                     device: Optional[Union[str, torch.device]] = None
                     ) -> dict[tuple[str, int], RunningStats]:
    """Global ``RunningStats`` per ``(capture, layer)`` over every rank of ``group``.

    ``recording``: a Recording (or a Probe) with the same layers and captures on every rank;
    any store works (``store="stats"`` is the constant-memory one). A rank with no tokens
    contributes nothing; a key with no tokens on any rank is left out of the result. Every rank
    must call this (it is a collective) and gets the same result. ``device``: where the
    reductions run (default: where the statistics live; CUDA for the NCCL backend).

    Raises ValueError on every rank when the ranks recorded different layers/captures or
    different feature sizes (checked collectively, so a mismatch cannot hang).
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("all_reduce_stats needs an initialised torch.distributed process "
                           "group (torch.distributed.init_process_group)")
    rec = _recording(recording)
    keys = [(capture, layer) for capture in rec.capture for layer in rec.layers]
    local: dict = {}
    for key in keys:
        try:
            local[key] = rec.stats(*key)
        except ValueError:  # nothing recorded for this key on this rank
            pass
    if device is None:
        if local:
            device = next(iter(local.values())).mean.device
        elif dist.get_backend(group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
    f64 = dict(dtype=torch.float64, device=device)

    # 1. the same keys on every rank? (max and min of a signature, one MAX reduction)
    signature = float(zlib.crc32(repr(keys).encode()))
    header = torch.tensor([signature, -signature], **f64)
    dist.all_reduce(header, op=dist.ReduceOp.MAX, group=group)
    if header[0].item() != -header[1].item():
        raise ValueError("all_reduce_stats: ranks recorded different layers or captures "
                         f"(this rank: {keys})")

    # 2. feature sizes (0 where a rank has nothing); they must agree where known
    dims = torch.tensor([[local[k].mean.numel() if k in local else 0,
                          -(local[k].mean.numel() if k in local else 10 ** 9)] for k in keys],
                        **f64).reshape(-1, 2)
    dist.all_reduce(dims, op=dist.ReduceOp.MAX, group=group)
    d_max = [int(v) for v in dims[:, 0].tolist()]
    d_min = [int(-v) for v in dims[:, 1].tolist()]
    bad = [k for k, hi, lo in zip(keys, d_max, d_min) if hi and hi != lo]
    if bad:
        raise ValueError(f"all_reduce_stats: ranks disagree on the feature size of {bad}")

    # 3. counts and weighted sums -> global mean
    pieces = []
    for key, d in zip(keys, d_max):
        if key in local:
            s = local[key]
            pieces += [torch.tensor([float(s.count)], **f64),
                       s.count * s.mean.to(**f64).reshape(-1)]
        else:
            pieces += [torch.zeros(1, **f64), torch.zeros(d, **f64)]
    flat = torch.cat(pieces) if pieces else torch.zeros(0, **f64)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    counts, means, offset = {}, {}, 0
    for key, d in zip(keys, d_max):
        n = flat[offset].item()
        counts[key] = int(round(n))
        means[key] = flat[offset + 1:offset + 1 + d] / n if n else None
        offset += 1 + d

    # 4. within-rank scatter plus between-rank scatter about the global mean
    pieces = []
    for key, d in zip(keys, d_max):
        m2 = torch.zeros(d, d, **f64)
        if key in local and counts[key]:
            s = local[key]
            delta = s.mean.to(**f64).reshape(-1) - means[key]
            m2 = (s.count - 1) * s.cov.to(**f64) + s.count * torch.outer(delta, delta)
        pieces.append(m2.reshape(-1))
    flat = torch.cat(pieces) if pieces else torch.zeros(0, **f64)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)

    out, offset = {}, 0
    for key, d in zip(keys, d_max):
        m2 = flat[offset:offset + d * d].reshape(d, d)
        offset += d * d
        if counts[key]:
            out[key] = RunningStats(counts[key], means[key], m2 / max(counts[key] - 1, 1))
    return out
