"""torch.distributed helpers: combine per-rank recordings into global statistics.

    >>> import os, tempfile
    >>> import torch.distributed as dist
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> tmp = tempfile.TemporaryDirectory()
    >>> rendezvous = "file://" + os.path.join(tmp.name, "rendezvous")
    >>> dist.init_process_group("gloo", init_method=rendezvous, rank=0, world_size=1)  # torchrun's job
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model, store="stats") as probe, torch.no_grad():   # on every rank
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))               # its own shard
    >>> stats = all_reduce_stats(probe.recording)             # the same result on every rank
    >>> stats[("resid_post", 1)].count, tuple(stats[("resid_post", 1)].cov.shape)
    (16, (32, 32))
    >>> dist.destroy_process_group(); tmp.cleanup()

Only the public ``recording.stats(capture, layer)`` (count, mean, unbiased covariance) is read.
Ranks are combined exactly with the pairwise (Chan et al.) update, as two sum-reductions:

    N = sum_r n_r,   mean = sum_r n_r mean_r / N,
    M2 = sum_r [ (n_r - 1) cov_r + n_r (mean_r - mean)(mean_r - mean)^T ],   cov = M2 / (N - 1)

which equals the statistics of one recording over all ranks' tokens (up to rounding; it avoids
the cancellation of the raw sum-of-outer-products formula). Everything is float64.

The training events (:class:`~spectral_hooks.integrations.tracker.Event`) need more than
moments: an effective rank, a p-value and per-token alignments are not sums over ranks. They
gather the token rows themselves to rank 0 (:func:`token_counts`, then :func:`gather_rows` per
layer), so that rank 0 computes exactly what one process would from the concatenation of every
rank's tokens, in rank order.
"""

from __future__ import annotations

import zlib
from typing import Any, Optional, Sequence, Union, cast

import torch
from torch import Tensor

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
    f64: dict[str, Any] = dict(dtype=torch.float64, device=device)

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


def world_size(group: Optional[Any] = None) -> int:
    """The number of ranks of ``group`` (1 outside torch.distributed)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _device(group: Optional[Any]) -> torch.device:
    """Where a collective's tensors live: the current CUDA device for NCCL, else the CPU."""
    if torch.distributed.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_rank(flag: bool, *, group: Optional[Any] = None) -> bool:
    """True on every rank when ``flag`` is True on at least one (a collective)."""
    dist = torch.distributed
    value = torch.tensor([int(bool(flag))], device=_device(group))
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value.item())


def token_counts(recording: Any, points: Sequence[str], *, group: Optional[Any] = None
                 ) -> list[list[int]]:
    """``counts[i][r]``: the real tokens rank r recorded at ``recording.layers[i]`` (0 where it
    recorded nothing), the same on every rank (a collective). ``points``: the capture points
    that will be gathered (they hold the same tokens). Raises ValueError on every rank when the
    ranks recorded different layers or capture points (checked first, so it cannot hang)."""
    dist = torch.distributed
    rec, device = _recording(recording), _device(group)
    layers, world = list(rec.layers), dist.get_world_size(group)
    signature = zlib.crc32(repr((layers, list(points), rec.store)).encode())
    signatures = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(signatures, torch.tensor([signature], device=device), group=group)
    if len({int(s.item()) for s in signatures}) != 1:
        raise ValueError("the ranks recorded different layers, capture points or stores "
                         f"(this rank: layers {layers}, capture {list(points)}, store "
                         f"{rec.store!r}): instrument the model the same way on every rank")
    has = rec.store != "stats" and bool(rec.steps) and bool(points)
    local = torch.tensor([rec.tokens(points[0], layer).shape[0] if has else 0
                          for layer in layers], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(counts, local, group=group)
    return [[int(c[i].item()) for c in counts] for i in range(len(layers))]


def gather_rows(rows: Optional[Tensor], counts: Sequence[int], width: int, *, dst: int = 0,
                group: Optional[Any] = None) -> Optional[Tensor]:
    """The float64 rows [sum(counts), width] of every rank, in rank order, on rank ``dst``
    (CPU); None on the other ranks, and on every rank when no rank has a row. A collective:
    ``counts`` (from :func:`token_counts`) must be the same on every rank and ``rows`` hold
    ``counts[rank]`` rows (None for 0). Ranks are padded to the largest count (gloo and NCCL
    gather equal shapes only); the padding is dropped on ``dst``."""
    dist = torch.distributed
    if sum(counts) == 0:
        return None
    device, rank = _device(group), dist.get_rank()
    n = 0 if rows is None else rows.shape[0]
    if n != counts[dist.get_rank(group)]:
        raise ValueError(f"gather_rows: this rank holds {n} rows but counts say "
                         f"{counts[dist.get_rank(group)]}")
    buf = torch.zeros(max(counts), width, dtype=torch.float64, device=device)
    if n:
        buf[:n] = cast(Tensor, rows).detach().to(device, torch.float64)
    parts = [torch.empty_like(buf) for _ in counts] if rank == dst else None
    dist.gather(buf, parts, dst=dst, group=group)
    if parts is None:
        return None
    return torch.cat([part[:c] for part, c in zip(parts, counts)]).cpu()
