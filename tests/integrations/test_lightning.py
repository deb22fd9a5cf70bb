"""SpectralLightningCallback in a real lightning.Trainer fit on CPU (tiny GPT-2 built offline):
metrics reach the trainer's own logger at the due steps, training is unchanged, no hooks stay."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

pl = pytest.importorskip("lightning.pytorch")

from spectral_hooks.hooks.taps import count_hook_points as count_hooks  # noqa: E402
from spectral_hooks.integrations.lightning import SpectralLightningCallback  # noqa: E402

STEPS, EVERY = 6, 2


class LM(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                                n_positions=64, bos_token_id=0, eos_token_id=0))

    def training_step(self, batch, batch_idx):
        loss = self.model(input_ids=batch, labels=batch).loss
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Remember(pl.loggers.Logger):
    """A Lightning logger that keeps what it is given."""

    def __init__(self):
        super().__init__()
        self.rows = []

    name, version = "remember", 0
    experiment = None

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def fit(callbacks):
    torch.manual_seed(0)
    module = LM()
    data = torch.randint(0, 100, (24, 10), generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    logger = Remember()
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=logger,
                         callbacks=callbacks, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         log_every_n_steps=5)
    trainer.fit(module, loader)
    return module, logger


def test_fit_logs_through_the_trainers_logger_and_changes_nothing():
    callback = SpectralLightningCallback(every=EVERY)
    module, logger = fit([callback])
    plain, _ = fit([])
    spectral = [(step, m) for step, m in logger.rows if "spectral/layer_00/gap_ratio" in m]
    assert [step for step, _ in spectral] == [2, 4, 6]
    assert all(len([k for k in m if k.startswith("spectral/layer_")]) == 10 for _, m in spectral)
    assert all(m["spectral/seconds"] > 0 for _, m in spectral)  # the cost of each event
    for (name, p), q in zip(module.named_parameters(), plain.parameters()):
        assert torch.equal(p, q), name  # bit-identical training
    assert count_hooks(module) == 0 and callback.tracker is None


def test_finds_the_transformer_or_says_where_to_look():
    from spectral_hooks.errors import UnsupportedModelError
    from spectral_hooks.integrations.lightning import find_transformer

    module = LM()
    assert find_transformer(module) is module.model
    assert find_transformer(module, "model") is module.model
    with pytest.raises(UnsupportedModelError, match="model="):
        find_transformer(torch.nn.Sequential(torch.nn.Linear(2, 2)))
