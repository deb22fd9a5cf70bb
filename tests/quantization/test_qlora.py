"""QLoRA (bitsandbytes nf4 + LoRA via peft) under the HF Trainer with SpectralCallback, and the
training integrations' promise: they never raise inside the user's training loop."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from spectral_hooks.integrations import SpectralCallback, SpectralTracker

try:  # the hook helpers move to spectral_hooks.hooks (another issue's refactor)
    from spectral_hooks.hooks.taps import count_hook_points as count_hooks
except ImportError:  # before that move
    from spectral_hooks.taps import count_hook_points as count_hooks  # type: ignore

from .models import VOCAB, quantized

STEPS, EVERY = 6, 2


def _data(n=24, length=10):
    tokens = torch.randint(1, VOCAB, (n, length), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": ids, "labels": ids} for ids in tokens]


def _trainer(model, tmp_path, lr=2e-2):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=STEPS,
                             per_device_train_batch_size=4, learning_rate=lr, logging_steps=1,
                             report_to=[], use_cpu=True, save_strategy="no", seed=0,
                             disable_tqdm=True, dataloader_num_workers=0)
    return Trainer(model=model, args=args, train_dataset=_data())


def _stored(model):
    from spectral_hooks.analysis.cache import _leaves

    return {f"{name}.{i}": leaf.detach().clone()
            for name, t in list(model.named_parameters()) + list(model.named_buffers())
            for i, leaf in enumerate(_leaves(t))}


def test_qlora_under_the_trainer(tmp_path):
    peft = pytest.importorskip("peft")
    model = quantized("bnb_nf4", lm_head=True, repack=False)
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"],
                             lora_dropout=0.0, task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, config)
    before = _stored(model)
    hooks = count_hooks(model)
    trainer = _trainer(model, tmp_path)
    callback = SpectralCallback(every=EVERY, jacobian_every=STEPS).attach(trainer)
    trainer.train()

    assert callback.event.failures == []
    assert [step for step, _ in callback.history] == [2, 4, 6]
    first, last = callback.history[0][1], callback.history[-1][1]
    for layer in (0, 1):
        for column in ("gap_ratio", "gamma", "abs_lambda1"):
            key = f"spectral/layer_{layer:02d}/{column}"
            assert all(math.isfinite(m[key]) for _, m in callback.history), key
    moved = [k for k in first if "abs_lambda1" in k and first[k] != last[k]]
    assert moved, "the spectral scalars do not move while the adapters train"
    assert "spectral/layer_01/jacobian/top_eig_abs" in last  # the replay ran on nf4 + LoRA
    logged = [h for h in trainer.state.log_history if "spectral/layer_00/gap_ratio" in h]
    assert [h["step"] for h in logged] == [2, 4, 6]

    after = _stored(model)
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed and all("lora_" in k for k in changed), changed  # only the adapters
    assert count_hooks(model) == hooks  # no hook left
    assert callback.probe is None


def test_a_metric_that_fails_is_missing_with_one_warning(tmp_path, monkeypatch, caplog):
    """Any model: an event that cannot be computed never raises into the Trainer."""
    import spectral_hooks.integrations.tracker as tracker
    from spectral_hooks.errors import UnsupportedModelError

    def refuse(*args, **kwargs):
        raise UnsupportedModelError("a layer this package cannot read")

    monkeypatch.setattr(tracker, "power_metrics", refuse)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB,
                                       n_positions=64, bos_token_id=0, eos_token_id=0))
    hooks = count_hooks(model)
    trainer = _trainer(model, tmp_path, lr=1e-3)
    callback = SpectralCallback(every=EVERY).attach(trainer)
    with caplog.at_level(logging.WARNING, logger="spectral_hooks.integrations"):
        trainer.train()
    assert len(callback.event.failures) == STEPS // EVERY
    warned = [r for r in caplog.records if "power metrics skipped" in r.getMessage()]
    assert len(warned) == 1 and "cannot read" in warned[0].getMessage()
    assert all(set(m) == {"spectral/seconds"} for _, m in callback.history)  # missing
    assert count_hooks(model) == hooks


def test_a_model_that_cannot_be_instrumented_trains_on(tmp_path, caplog):
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 8)
            self.out = torch.nn.Linear(8, VOCAB)

        def forward(self, input_ids=None, labels=None):
            logits = self.out(self.embed(input_ids))
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
            return {"loss": loss, "logits": logits}

    trainer = _trainer(Tiny(), tmp_path, lr=1e-3)
    callback = SpectralCallback(every=EVERY).attach(trainer)
    with caplog.at_level(logging.WARNING, logger="spectral_hooks.integrations"):
        trainer.train()
    assert callback.probe is None and callback.history == []
    assert [what for what, _ in callback.event.failures] == ["instrumenting the model"]


def test_tracker_step_never_raises(monkeypatch):
    import spectral_hooks.integrations.tracker as tracker

    def broken(*args, **kwargs):
        raise RuntimeError("solver did not converge")

    monkeypatch.setattr(tracker, "power_metrics", broken)
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=VOCAB))
    with SpectralTracker(model, every=1) as track:
        for step in (1, 2):
            model(torch.arange(8)[None])
            metrics = track.step(step)
            assert metrics is not None and set(metrics) == {"spectral/seconds"}
        assert len(track.event.failures) == 2


def test_qlora_in_a_plain_loop_with_the_tracker():
    """SpectralTracker on an nf4 + LoRA model in a plain loop: finite scalars, no failure."""
    peft = pytest.importorskip("peft")
    model = quantized("bnb_nf4", lm_head=True, repack=False)
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                       target_modules=["v_proj", "o_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    hooks = count_hooks(model)
    logged = []
    with SpectralTracker(model, every=2, jacobian_every=4) as track:
        for step, batch in enumerate(_data(8, 10)[:4], start=1):
            ids = batch["input_ids"][None]
            model(input_ids=ids, labels=ids).loss.backward()
            metrics = track.step(step)
            optimizer.step()
            optimizer.zero_grad()
            if metrics:
                logged.append(metrics)
        assert track.event.failures == []
    assert len(logged) == 2
    assert all(math.isfinite(v) for m in logged for v in m.values())
    assert "spectral/layer_01/jacobian/top_eig_abs" in logged[-1]
    assert logged[0]["spectral/layer_01/abs_lambda1"] != logged[1]["spectral/layer_01/abs_lambda1"]
    assert count_hooks(model) == hooks


def test_qlora_under_lightning():
    pl = pytest.importorskip("lightning.pytorch")
    peft = pytest.importorskip("peft")
    from spectral_hooks.integrations.lightning import SpectralLightningCallback

    base = quantized("bnb_nf4", lm_head=True, repack=False)
    base = peft.prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    adapted = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                        target_modules=["v_proj", "o_proj"]))

    class QLoRA(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = adapted

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=2e-2)

    class Remember(pl.loggers.Logger):
        name, version, experiment = "remember", 0, None

        def __init__(self):
            super().__init__()
            self.rows = []

        def log_metrics(self, metrics, step=None):
            self.rows.append((step, dict(metrics)))

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    data = torch.randint(1, VOCAB, (16, 10), generator=torch.Generator().manual_seed(1))
    logger = Remember()
    callback = SpectralLightningCallback(every=2)
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=logger,
                         callbacks=[callback], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False)
    hooks = count_hooks(adapted)
    trainer.fit(QLoRA(), torch.utils.data.DataLoader(data, batch_size=4))
    assert callback.guard.failures == []
    spectral = [(s, m) for s, m in logger.rows if "spectral/layer_01/gap_ratio" in m]
    assert [s for s, _ in spectral] == [2, 4]
    assert all(math.isfinite(v) for _, m in spectral for v in m.values())
    assert count_hooks(adapted) == hooks
