"""A 2-process gloo DDP loop with SpectralTracker on the DDP-wrapped model, the ranks training on
different batches of different sizes: only rank 0 logs; the logged data-dependent columns
(alignment, consensus, erank, rho ...) equal one process's computation on the concatenation of
both ranks' tokens (to rounding), the weight-only columns equal rank 0's own; a rank that recorded
nothing contributes nothing, and when no rank recorded anything every rank gets None; ranks that
instrumented different layers are refused on every rank; training
is bit-identical with and without the tracker on every rank, and nothing hangs."""

import json
import math
from pathlib import Path

import pytest
import torch

from spectral_hooks.analysis.power import layer_power_spectrum
from spectral_hooks.anatomy.weights import LayerFactors
from spectral_hooks.metrics.power import power_row

from . import spawn
from ._ddp_tracker_worker import COLUMNS, DATA, STEPS, WEIGHTS

WORLD = 2


def reference(factors: dict, tokens: list[dict]) -> dict:
    """One process, the concatenation of every rank's tokens (rank order), the same columns."""
    out = {}
    for layer, (W_O, W_V) in factors.items():
        pre, post = (torch.cat([t[(c, layer)] for t in tokens])
                     for c in ("resid_pre", "resid_post"))
        factors = LayerFactors(layer, W_O.to(torch.float64), W_V.to(torch.float64), None)
        row = power_row(layer_power_spectrum(factors), pre, post, layer=layer)
        out.update({f"spectral/layer_{layer:02d}/{c}": float(row[c]) for c in COLUMNS
                    if not math.isnan(float(row[c]))})
    return out


def strip(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "spectral/seconds"}


def same_metrics(got: dict, want: dict) -> bool:
    """The same columns with the same values up to rounding: the ranks and this process may run
    their reductions with other thread counts (tests/README.md). An approximation from one rank's
    tokens differs in the third digit, so rel=1e-12 still tells gathered from approximated."""
    return got.keys() == want.keys() and all(
        got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-300) for k in got)


def test_ddp_plain_loop_logs_global_metrics_once_and_changes_nothing(tmp_path):
    spawn.run_ranks(Path(__file__).with_name("_ddp_tracker_worker.py"), WORLD, tmp_path,
                    timeout=300)
    rank0 = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rank0] == [2, 4]
    assert (tmp_path / "rank1.jsonl").read_text() == ""  # rank 1 never logs
    snaps = [torch.load(tmp_path / f"snapshots{r}.pt", weights_only=False) for r in range(WORLD)]
    assert all(v is None for v in snaps[1]["returned"].values())
    for row in rank0:
        step = row["step"]
        logged = {k: v for k, v in row.items() if k not in ("step", "spectral/seconds")}
        assert logged == strip(snaps[0]["returned"][step])
        want = reference(snaps[0][step]["factors"], [s[step]["tokens"] for s in snaps])
        assert same_metrics(logged, want)  # gathered, not approximated
        local = snaps[0][step]["local"]  # rank 0's batch alone
        for key, value in logged.items():
            if key.rsplit("/", 1)[1] in WEIGHTS:
                assert value == local[key], key
        assert logged["spectral/layer_00/n_tokens"] == (4 + 3) * 8
        assert local["spectral/layer_00/n_tokens"] == 4 * 8
        assert logged["spectral/layer_01/erank"] != local["spectral/layer_01/erank"]
    # rank 1 recorded nothing: rank 0's tokens alone, no hang
    empty = snaps[0]["rank1_empty"]
    got = strip(snaps[0]["rank1_empty_returned"])
    assert same_metrics(got, reference(empty["factors"], [empty["tokens"]]))
    assert same_metrics(got, empty["local"])
    assert snaps[1]["rank1_empty_returned"] is None
    # nobody recorded anything: None on every rank, no hang
    assert snaps[0]["nobody_returned"] is None and snaps[1]["nobody_returned"] is None
    assert set(COLUMNS) == set(WEIGHTS) | set(DATA)
    for snap in snaps:  # different layers per rank: refused on both, in one sentence
        assert snap["mismatch"].startswith("the ranks recorded different layers"), snap["mismatch"]
    for rank in range(WORLD):
        saved = torch.load(tmp_path / f"weights{rank}.pt")
        for name, tensor in saved["with"].items():
            assert torch.equal(tensor, saved["without"][name]), (rank, name)
    assert len(rank0) == STEPS // 2
