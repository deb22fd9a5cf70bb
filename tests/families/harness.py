"""The checks every registered family passes (issue 15), written once.

    >>> from tests.families.harness import check_family
    >>> check_family(model, ids, value_in="self_attn.v_proj", output="self_attn.o_proj")

Each check compares the library against an oracle that does not use the library's code path:

- the recording against the model's own ``output_hidden_states``;
- F = sum_h W_O^h W_V^h against a least-squares fit of the raw modules (with one token,
  attention weights are 1, so the output projection's output is W_O (W_V x + b_V) + b_O for
  any input x fed to the value projection's input module ``value_in``);
- the dense block Jacobian against ``torch.func.jacfwd`` of the real block (tests/oracles.py,
  norms in float64), and the matrix-free top-k eigenvalues against the dense eig;
- outputs bit-identical with and without the probe, and zero handles left.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

import spectral_hooks as sh
from spectral_hooks.linalg import eigs
from spectral_hooks.linearize import block_jacobian
from tests.oracles import assert_same_spectrum, eigvals_by_modulus, token_jacobian


def _first(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return out[0]
    return out.last_hidden_state


def check_recording(model, inputs: dict, *, atol: float = 1e-12, stacks: tuple = ()):
    """Recording equals ``output_hidden_states``; outputs bit-identical; no handle left.
    ``stacks`` (encoder-decoder models): compare each stack's probe with the model's
    ``<stack>_hidden_states``."""
    with torch.no_grad():
        expected = model(**inputs, output_hidden_states=True)
        with sh.instrument(model) as probe:
            out = model(**inputs, output_hidden_states=True)
    assert torch.equal(_first(out), _first(expected)), "the probe changed the model's output"
    assert probe.n_handles == 0
    if not stacks:
        _check_hidden(probe, out.hidden_states, atol)
    for stack in stacks:
        _check_hidden(probe.probes[stack], getattr(out, f"{stack}_hidden_states"), atol)
    return probe


def _check_hidden(probe, hidden, atol: float) -> None:
    rec, n = probe.recording, probe.anatomy.n_layers
    assert n == len(hidden) - 1, (n, len(hidden))
    for layer in range(n):
        torch.testing.assert_close(rec.resid_pre[layer], hidden[layer], rtol=0, atol=atol)
        if layer < n - 1:  # many families normalise the last hidden state
            torch.testing.assert_close(rec.resid_post[layer], hidden[layer + 1], rtol=0,
                                       atol=atol)


def oracle_F(model, block, value_in: str, output: str, d_model: int, *,
             call=None) -> torch.Tensor:
    """Fit y = F x + c from one-token inputs through the raw modules of ``block``:
    ``value_in`` is the module whose input feeds the value projection (the projection itself,
    or a fused qkv), ``output`` the output projection. ``call(model)`` runs the model on a
    batch of at least d + 1 sequences (default: ``model(input_ids [4d, 1])``; vision towers:
    ``pixel_values``): every position of a sequence gets the same random input, so the values
    are equal and attention, whatever its weights, returns them."""
    v_mod, o_mod = block.get_submodule(value_in), block.get_submodule(output)
    xs, ys = [], []

    def random_input(module, args):  # one random vector per sequence, at every position:
        x = args[0]                      # equal values make any attention pattern exact
        xs.append(torch.randn_like(x[:, :1]).expand_as(x) if x.ndim == 3 else torch.randn_like(x))
        return (xs[-1],) + tuple(args[1:])

    h1 = v_mod.register_forward_pre_hook(random_input)
    h2 = o_mod.register_forward_hook(lambda m, a, o: ys.append(_first(o).detach()))
    try:
        with torch.no_grad():
            if call is None:
                model(torch.randint(0, 100, (4 * d_model, 1)))
            else:
                call(model)
    finally:
        h1.remove(), h2.remove()
    x, y = xs[0].reshape(-1, d_model), ys[0].reshape(-1, d_model)
    design = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
    return torch.linalg.lstsq(design, y).solution[:-1].T


def check_F(model, value_in: str, output: str, *, call=None, tol: float = 1e-6,
            anatomy=None, cross: bool = False):
    """F of the first and last layer = :func:`oracle_F`. ``anatomy``: one stack of an
    encoder-decoder model (default ``anatomy_of(model)``); ``cross``: the cross-attention's F
    (``value_in``/``output`` then name the cross-attention's raw modules)."""
    anatomy = sh.anatomy_of(model) if anatomy is None else anatomy
    for layer in sorted({0, anatomy.n_layers - 1}):
        part = anatomy.layers[layer]
        W = ((part.cross_output_weights(), part.cross_value_weights()) if cross
             else (part.output_weights(), part.value_weights()))
        F = torch.einsum("hdk,hkm->dm", *W)
        want = oracle_F(model, part.block, value_in, output, anatomy.d_model, call=call)
        torch.testing.assert_close(F, want, rtol=tol, atol=tol)


def check_jacobian(probe, *, k: int = 4, position: Optional[int] = None, tol: float = 1e-10,
                   oracle_mode: str = "forward", layers: Optional[tuple[int, ...]] = None):
    """Dense block Jacobian = jacfwd of the real block (to ``tol`` of its largest entry) and
    the matrix-free top-k eigenvalues = the dense eig's (1e-8), on every layer. ``position``:
    a recording row (default: the anatomy's default position, -1 counting from the end);
    ``layers``: the layers checked (default: every recorded layer);
    ``oracle_mode="autograd"``: the oracle by reverse-mode autograd (blocks without forward AD,
    see tests/oracles.token_jacobian)."""
    L = probe.recording.mask.shape[1]
    p = probe.anatomy.default_position if position is None else position
    p = p % L
    for layer in probe.recording.layers if layers is None else layers:
        want = token_jacobian(probe, layer, position=p, mode=oracle_mode)
        op = block_jacobian(probe.anatomy, probe.recording, layer, position=p)
        got = op.to_dense()
        scale = float(want.abs().max())
        assert float((got - want).abs().max()) <= tol * scale, (layer, "dense Jacobian")
        result = eigs(op, k, tol=1e-10, seed=0, return_vectors=False)
        assert bool(result.converged), layer
        got_values = np.asarray(result.values)
        exact = eigvals_by_modulus(np.asarray(want))[:len(got_values)]
        assert_same_spectrum(got_values, exact, 1e-8)


def check_family(model, inputs: dict, *, value_in: str, output: str, causal: bool,
                 family: Optional[str] = None, k: int = 4, f_call=None,
                 oracle_mode: str = "forward", position: Optional[int] = None,
                 layers: Optional[tuple[int, ...]] = None):
    """Every check above on a float64 ``model``; returns the probe. ``inputs``: the model's
    keyword inputs (``input_ids`` or ``pixel_values``, ...); ``f_call``: see :func:`oracle_F`;
    ``position``: the Jacobian row (default: the anatomy's default position); ``layers``: the
    layers whose Jacobians are checked (default: all); ``oracle_mode``: see check_jacobian."""
    anatomy = sh.anatomy_of(model)
    if family is not None:
        assert anatomy.family == family, anatomy.family
    assert anatomy.causal == causal
    assert not anatomy.family.startswith("generic"), "a registered family was expected"
    probe = check_recording(model, inputs)
    check_F(model, value_in, output, call=f_call)
    check_jacobian(probe, k=k, oracle_mode=oracle_mode, position=position, layers=layers)
    return probe
