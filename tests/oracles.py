"""Dense float64 oracles shared by the tests, written independently of the library's code paths.

    >>> from tests.oracles import token_jacobian, eigvals_by_modulus, assert_same_spectrum
    >>> J = token_jacobian(probe, layer=1)              # d x d, jacfwd of the HF block itself
    >>> assert_same_spectrum(ours, eigvals_by_modulus(J)[:k], 1e-8)

Block Jacobians: ``torch.func.jacfwd`` of the real Hugging Face block module, called on float64
copies of the inputs the probe recorded for it (math SDPA backend: the fused kernels have no
forward AD). Nothing from ``spectral_hooks.linearize`` is used: only the recorded call
(``recording.block_input``) and the block module (``anatomy.layers[l].block``).

Spectra and metrics: numpy / scipy on the dense matrix (METRICS.md section 2 definitions).
"""

from __future__ import annotations

import contextlib
import copy
import types
from typing import Any

import numpy as np
import scipy.linalg
import torch
from scipy.optimize import linear_sum_assignment
from torch.nn.attention import SDPBackend, sdpa_kernel

# ------------------------------------------------------------------------ block Jacobians


def _float64(value: Any, keep: torch.Tensor) -> Any:
    """A float64 copy of every floating tensor in a (nested) call argument, except ``keep``
    (the hidden input that carries the jacfwd tangents)."""
    if value is keep:
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).clone() if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_float64(v, keep) for v in value)
    if isinstance(value, list):
        return [_float64(v, keep) for v in value]
    if isinstance(value, dict):
        return {k: _float64(v, keep) for k, v in value.items()}
    return value


@contextlib.contextmanager
def _softmax_in_input_dtype():
    """Eager attention (Gemma 2) calls softmax(..., dtype=torch.float32): in the oracle a
    float64 input keeps float64, as in the library's float64 replay."""
    original = torch.nn.functional.softmax

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        if dtype is not None and x.dtype == torch.float64:
            dtype = torch.float64
        return original(x, dim=dim, dtype=dtype)
    torch.nn.functional.softmax = softmax
    try:
        yield
    finally:
        torch.nn.functional.softmax = original


class _Float64Stays(torch.overrides.TorchFunctionMode):
    """Casts of a float64 tensor down to float32 (``x.float()``, ``x.to(torch.float32)``: MPT's
    softmax, Cohere's LayerNorm, ...) keep float64: the oracle block computes in float64
    throughout, as the library's float64 replay does."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
            if func is torch.Tensor.float:
                return x
            if func in (torch.Tensor.to, torch.Tensor.type):
                args = tuple(torch.float64 if a is torch.float32 else a for a in args)
                if kwargs.get("dtype") is torch.float32:
                    kwargs = {**kwargs, "dtype": torch.float64}
        return func(*args, **kwargs)


def block_output(block: torch.nn.Module, call: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The block's hidden-state output [1, L, d] for ``hidden`` [1, L, d], the rest of the
    recorded call (masks, rotary embeddings, ...) as float64 copies."""
    if any(p.dtype != torch.float64 for p in block.parameters()):
        raise TypeError("float64 blocks only: see recorded_block for a float64 copy")
    args, kwargs = call.with_hidden(hidden)
    with _softmax_in_input_dtype(), _Float64Stays():
        out = block(*_float64(args, hidden), **_float64(kwargs, hidden))
    return out[0] if isinstance(out, tuple) else out


def _rms_norm_float64(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's RMSNorm written out in the input's dtype (HF computes it in float32):
    x / sqrt(mean(x^2) + eps) times w, or times (1 + w) for zero-centred gains (Gemma's,
    Qwen3-Next's: told apart by the module's own forward when it is replaced, see
    :func:`_gain_offset`)."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if getattr(module, "weight", None) is None:  # no gain (Gemma 3n's value norm)
        return y
    return (module._oracle_gain_offset + module.weight) * y


def _gain_offset(module: torch.nn.Module) -> float:
    """1.0 where the norm's own forward multiplies by (1 + weight), else 0.0: its output on a
    random input, compared with both."""
    w = module.weight.detach().to(torch.float64)
    x = torch.randn(3, w.shape[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), _Float64Stays():
        own = type(module).forward(module, x.to(module.weight.dtype)).to(torch.float64)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return 1.0 if (own - (1 + w) * y).abs().max() < (own - w * y).abs().max() else 0.0


def float64_norms(block: torch.nn.Module) -> torch.nn.Module:
    """``block`` with every RMSNorm (and T5's T5LayerNorm, an RMSNorm by another name) replaced,
    in place, by :func:`_rms_norm_float64`."""
    for module in block.modules():
        if type(module).__name__.endswith("RMSNorm") or type(module).__name__ == "T5LayerNorm":
            if getattr(module, "weight", None) is not None:  # read before the forward goes
                module._oracle_gain_offset = _gain_offset(module)
            module.forward = types.MethodType(_rms_norm_float64, module)
    return block


def recorded_block(probe: Any, layer: int, sample: int = 0):
    """(block module, recorded call, float64 copy of its hidden input [L, d]). The block is a
    float64 deep copy of the model's own, its RMSNorms computing in float64
    (:func:`float64_norms`), as the library's float64 replay does."""
    call = probe.recording.block_input(layer, sample)
    hidden = call.hidden.detach().to(torch.float64).clone()[0]
    block = float64_norms(copy.deepcopy(probe.anatomy.layers[layer].block).to(torch.float64))
    return block, call, hidden


def full_jacobian(probe: Any, layer: int, *, sample: int = 0) -> torch.Tensor:
    """d block(H)[i, :] / d H[j, :] as [L, d, L, d] (the whole sequence)."""
    block, call, H0 = recorded_block(probe, layer, sample)

    def f(H):
        return block_output(block, call, H[None])[0]

    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        return torch.func.jacfwd(f)(H0).detach()


def token_jacobian(probe: Any, layer: int, *, position: int | None = None,
                   sample: int = 0, mode: str = "forward") -> torch.Tensor:
    """d block(H)[p] / d H[p] as [d, d]; ``position`` defaults to the last token.
    ``mode="forward"``: torch.func.jacfwd; ``"autograd"``: torch.autograd.functional.jacobian
    (reverse mode through each op's own backward, for blocks with an autograd.Function that
    has no forward-AD rule, BLOOM's GeLU)."""
    block, call, H0 = recorded_block(probe, layer, sample)
    p = H0.shape[0] - 1 if position is None else position

    def f(x):
        H = torch.cat([H0[:p], x[None], H0[p + 1:]], 0)
        return block_output(block, call, H[None])[0, p]

    if mode == "autograd":
        with sdpa_kernel(SDPBackend.MATH):
            return torch.autograd.functional.jacobian(f, H0[p]).detach()
    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        return torch.func.jacfwd(f)(H0[p]).detach()


def chained_token_jacobian(probe: Any, first: int, last: int, *,
                           sample: int = 0) -> torch.Tensor:
    """d h_{last+1}[p] / d h_first[p] at the last token p, blocks first..last applied in turn
    to each other's outputs (each with its own recorded masks and positions) as [d, d]."""
    blocks = [recorded_block(probe, layer, sample) for layer in range(first, last + 1)]
    H0 = blocks[0][2]

    def f(x):
        H = torch.cat([H0[:-1], x[None]], 0)[None]
        for block, call, _ in blocks:
            H = block_output(block, call, H)
        return H[0, -1]

    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        return torch.func.jacfwd(f)(H0[-1]).detach()


def last_real_position(probe: Any, sample: int = 0) -> int:
    """The last non-padding token of ``sample`` in the recorded attention mask."""
    return int(probe.recording.mask[sample].nonzero().max())


# ------------------------------------------------------------------------ spectra


def eigvals_by_modulus(M):
    """All eigenvalues of the dense matrix ``M``, largest modulus first (torch in, torch out;
    numpy in, numpy out)."""
    if isinstance(M, torch.Tensor):
        vals = torch.linalg.eigvals(M)
        return vals[torch.argsort(-vals.abs(), stable=True)]
    vals = np.linalg.eigvals(np.asarray(M))
    return vals[np.argsort(-np.abs(vals), kind="stable")]


def top_k_by_modulus(values, k: int) -> np.ndarray:
    """Top-k of ``values`` by modulus, extended to k + 1 when the boundary is a conjugate pair
    (a real solver returns both halves of a pair or neither)."""
    ev = np.asarray(values, dtype=complex)
    ev = ev[np.argsort(-np.abs(ev), kind="stable")]
    if k < len(ev) and abs(ev[k - 1].imag) > 1e-9 and abs(ev[k] - np.conj(ev[k - 1])) < 1e-8:
        return ev[:k + 1]
    return ev[:k]


def assert_same_spectrum(got, want, tol: float) -> None:
    """Same multiset up to ``tol``, conjugate-invariant: each computed value has a partner in
    the reference, and the sorted moduli agree."""
    a, b = np.asarray(got, dtype=complex), np.asarray(want, dtype=complex)
    assert len(a) == len(b), (len(a), len(b))
    for z in a:
        assert np.min(np.abs(b - z)) < tol, (z, b)
    np.testing.assert_allclose(np.sort(np.abs(a)), np.sort(np.abs(b)), atol=tol)


def matched_distance(a, b) -> float:
    """Largest distance between the values of ``a`` and ``b`` under their best one-to-one
    matching (linear sum assignment)."""
    a, b = np.asarray(a, dtype=complex).ravel(), np.asarray(b, dtype=complex).ravel()
    cost = np.abs(a[:, None] - b[None, :])
    r, c = linear_sum_assignment(cost)
    return float(cost[r, c].max())


def farthest_from(values, found) -> float:
    """max over ``values`` of the distance to the nearest of ``found`` or its conjugate: how
    far the worst reference value is from being found."""
    v = np.asarray(values, dtype=complex).ravel()
    f = np.asarray(found, dtype=complex).ravel()
    d = np.minimum(np.abs(v[:, None] - f[None, :]), np.abs(v[:, None] - np.conj(f)[None, :]))
    return float(d.min(1).max())


# ------------------------------------------------------------------------ Jacobian metrics


def rotation_stats(lam) -> tuple[float, float, float]:
    """(frac_complex, mean_abs_angle, frac_negative) of eigenvalues ``lam`` of J: the angle is
    |lambda|-weighted over the complex ones only (NaN if none); real negatives are reflections."""
    lam = np.asarray(lam, dtype=complex)
    zero = np.abs(lam) <= 1e-10 * np.abs(lam).max()  # numerical zeros: neither complex nor negative
    cplx = (np.abs(lam.imag) > 1e-6 * np.abs(lam)) & ~zero
    neg = ~cplx & ~zero & (lam.real < 0)
    a = np.abs(lam[cplx])
    angle = float(np.sum(a * np.abs(np.angle(lam[cplx]))) / np.sum(a)) if cplx.any() else np.nan
    return float(cplx.mean()), angle, float(neg.mean())


def sym_energy(D: np.ndarray) -> float:
    """||sym(D)||_F^2 / ||D||_F^2."""
    S = (D + D.T) / 2
    return float(np.sum(S ** 2) / np.sum(D ** 2))


def commutator(D: np.ndarray) -> float:
    """||D^T D - D D^T||_F / ||D||_F^2."""
    return float(np.linalg.norm(D.T @ D - D @ D.T) / np.sum(D ** 2))


def henrici_departure(J: np.ndarray) -> float:
    """||strict upper triangle of the complex Schur form||_F (unnormalised)."""
    T, _ = scipy.linalg.schur(np.asarray(J).astype(complex), output="complex")
    return float(np.linalg.norm(np.triu(T, 1)))


def self_alignment(D: np.ndarray, k: int) -> float:
    """||U_k^T V_k||_F^2 / k for the top-k singular vectors of D."""
    U, _, Vt = np.linalg.svd(D)
    return float(np.linalg.norm(U[:, :k].T @ Vt[:k].T) ** 2 / k)


def jacobian_metrics_oracle(J, k: int) -> dict[str, Any]:
    """The exact Jacobian-view metrics of ``J`` (METRICS.md section 2), as named in the jacobian
    table, plus its spectrum ``lam``."""
    J = np.asarray(J, dtype=np.float64)
    delta = J - np.eye(J.shape[0])
    lam = np.linalg.eigvals(J)
    frac, angle, neg = rotation_stats(lam)
    tfrac, tangle, tneg = rotation_stats(top_k_by_modulus(lam, k))
    dep = henrici_departure(J)
    return {"frac_complex": frac, "mean_abs_angle": angle, "frac_negative": neg,
            f"frac_complex_top{k}": tfrac, f"mean_abs_angle_top{k}": tangle,
            f"frac_negative_top{k}": tneg, "sym_energy": sym_energy(delta),
            "commutator": commutator(delta), "departure": dep,
            "departure_rel": dep / np.linalg.norm(delta),
            f"self_alignment_top{k}": self_alignment(delta, k),
            "top_eig_abs": float(np.abs(lam).max()), "lam": lam}


# ------------------------------------------------------------------------ layer weights


def _llama_like(attn, config):
    return (attn.v_proj, attn.o_proj, config.num_attention_heads, config.num_key_value_heads)


def _attention_of(model, family: str, layer: int):
    """(value Linear-like weight [H_kv dh, d], its bias, output weight [d, H dh], its bias,
    n_heads, n_kv_heads) read straight from the HF modules, column convention (x -> W x)."""
    cfg = model.config
    if family == "gpt2":  # Conv1D stores (in, out): transpose here
        attn, d = model.h[layer].attn, cfg.n_embd
        W, b = attn.c_attn.weight, attn.c_attn.bias
        return W[:, 2 * d:].T, b[2 * d:], attn.c_proj.weight.T, attn.c_proj.bias, \
            cfg.n_head, cfg.n_head
    if family in ("bert", "albert"):
        if family == "bert":
            att = model.encoder.layer[layer].attention
            value, out = att.self.value, att.output.dense
        else:  # one shared layer applied num_hidden_layers times
            att = model.encoder.albert_layer_groups[0].albert_layers[0].attention
            value, out = att.value, att.dense
        H = cfg.num_attention_heads
        return value.weight, value.bias, out.weight, out.bias, H, H
    if family == "gpt_neo":
        attn = model.h[layer].attn.attention
        return attn.v_proj.weight, attn.v_proj.bias, attn.out_proj.weight, \
            attn.out_proj.bias, cfg.num_heads, cfg.num_heads
    if family == "gpt_neox":  # fused qkv rows laid out (head, [q|k|v], dh)
        attn, H = model.layers[layer].attention, cfg.num_attention_heads
        d = cfg.hidden_size
        W = attn.query_key_value.weight.view(H, 3, d // H, d)[:, 2].reshape(d, d)
        b = attn.query_key_value.bias.view(H, 3, d // H)[:, 2].reshape(d)
        return W, b, attn.dense.weight, attn.dense.bias, H, H
    value, out, H, H_kv = _llama_like(model.layers[layer].self_attn, cfg)
    return value.weight, value.bias, out.weight, out.bias, H, H_kv


def attention_norm_gain(model, family: str, layer: int):
    """The elementwise gain of the norm feeding attention, or None (post-norm families)."""
    if family in ("gpt2", "gpt_neo"):
        return model.h[layer].ln_1.weight
    if family == "gpt_neox":
        return model.layers[layer].input_layernorm.weight
    if family in ("bert", "albert", "olmo2"):  # norms after attention, not before
        return None
    weight = model.layers[layer].input_layernorm.weight
    return 1 + weight if family.startswith("gemma") else weight


def layer_matrix_and_bias(model, family: str, layer: int, *, fold_norm: bool = False):
    """(F_t = sum_h W_O^h W_V^h, c_t = W_O b_V + b_O) in float64, head h reading the value
    group h // (H / H_kv) (GQA); ``fold_norm``: F diag(gain of the norm feeding attention)."""
    W_V, b_V, W_O, b_O, H, H_kv = (t.detach().double() if isinstance(t, torch.Tensor) else t
                                   for t in _attention_of(model, family, layer))
    dh = W_O.shape[1] // H
    F = torch.zeros(W_O.shape[0], W_V.shape[1], dtype=torch.float64)
    c = torch.zeros(W_O.shape[0], dtype=torch.float64) if b_O is None else b_O.clone()
    for h in range(H):
        g = h // (H // H_kv)
        W_O_h, rows = W_O[:, h * dh:(h + 1) * dh], slice(g * dh, (g + 1) * dh)
        F += W_O_h @ W_V[rows]
        if b_V is not None:
            c += W_O_h @ b_V[rows]
    gain = attention_norm_gain(model, family, layer) if fold_norm else None
    if gain is not None:
        F = F @ torch.diag(gain.detach().double())
    return F, c


def power_oracle(F) -> tuple[float, float]:
    """(|lambda_1|, gap ratio |lambda_2| / |lambda_1|) of F, lambda_2 the first eigenvalue
    that is not the conjugate of lambda_1 (METRICS.md section 1)."""
    vals = eigvals_by_modulus(np.asarray(F, dtype=np.float64))
    lam1 = vals[0]
    rest = vals[1:]
    if abs(lam1.imag) > 1e-12 * abs(lam1):
        rest = np.delete(rest, np.argmin(np.abs(rest - np.conj(lam1))))
    return float(abs(lam1)), float(abs(rest[0]) / abs(lam1))
