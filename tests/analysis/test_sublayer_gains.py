"""``analyze(topology={"sublayers": True})``: each unit's gain through the attention and the
feed-forward sublayer equals log ||J e_i|| of a hand-written sublayer function's jacfwd
(tests/test_linearize_sublayers.py) at the anchor token, trained and initialised; per community
the rows by layer type average their units; parallel blocks are refused at analyze()."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import spectral_hooks as sh
from spectral_hooks.anatomy.base import fresh_model
from spectral_hooks.errors import OptionError, UnsupportedModelError
from tests.test_linearize_sublayers import hand_oracles
from tests.tiny_models import make_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
pytest.importorskip("networkx")
IDS = torch.randint(1, 100, (1, 7), generator=torch.Generator().manual_seed(2))


def _record(model):
    with sh.instrument(model) as probe, torch.no_grad():
        model(IDS)
    return probe


def _oracle_gains(model, family, probe, layer):
    attn, ffn, x, mid = hand_oracles(model, family, probe, layer, IDS.shape[1] - 1)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        J_attn = torch.func.jacfwd(attn)(x).numpy()
        J_ffn = torch.func.jacfwd(ffn)(mid).numpy()
    return np.log(np.linalg.norm(J_attn, axis=0)), np.log(np.linalg.norm(J_ffn, axis=0))


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_sublayer_gains_match_jacfwd_and_communities_average_them(family):
    model = make_model(family)
    probe = _record(model)
    report = probe.analyze(jacobian={"k": 4, "dense": True}, topology={"sublayers": True},
                           reinit=True, power=False, progress=False)
    units, table = report.units, report.communities
    init = fresh_model(model, seed=1)
    init_probe = _record(init)
    for layer in range(probe.anatomy.n_layers):
        rows = units.query("layer == @layer")
        attn, ffn = _oracle_gains(model, family, probe, layer)
        attn0, ffn0 = _oracle_gains(init, family, init_probe, layer)
        for column, want in (("log_gain_attn", attn), ("log_gain_ffn", ffn),
                             ("log_gain_attn_init", attn0), ("log_gain_ffn_init", ffn0)):
            np.testing.assert_allclose(rows[column], want, rtol=1e-9, atol=1e-12,
                                       err_msg=column)
    assert set(table.layer_type) == {"block", "attention", "ffn"}
    for layer_type, column in (("attention", "log_gain_attn"), ("ffn", "log_gain_ffn")):
        means = units.groupby(["layer", "community"])[[column, column + "_init"]].mean()
        part = table[table.layer_type == layer_type]
        assert len(part) == len(table[table.layer_type == "block"])
        for row in part.itertuples():
            assert row.mean_log_gain == pytest.approx(means.loc[(row.layer, row.community),
                                                                column], rel=1e-12)
            assert row.mean_log_gain_init == pytest.approx(
                means.loc[(row.layer, row.community), column + "_init"], rel=1e-12)
        assert part.amplification.isna().all()


def test_default_topology_has_block_rows_only_and_no_sublayer_columns():
    probe = _record(make_model("bert"))
    report = probe.analyze(jacobian={"k": 4, "dense": True}, topology=True, power=False,
                           progress=False)
    assert set(report.communities.layer_type) == {"block"}
    assert not {"log_gain_attn", "log_gain_ffn"} & set(report.units.columns)


def test_parallel_blocks_are_refused_and_the_option_is_validated():
    probe = _record(make_model("gpt_neox"))
    with pytest.raises(UnsupportedModelError, match="parallel"):
        probe.analyze(topology={"sublayers": True}, power=False)
    with pytest.raises(OptionError, match="topology"):
        sh.AnalyzeOptions(topology={"sublayer": True})
    assert sh.AnalyzeOptions(topology={"sublayers": True}).to_dict()["topology"] == \
        {"sublayers": True}
