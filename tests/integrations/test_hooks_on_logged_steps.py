"""The training integrations put hooks on the model only for the steps they log: a forward of a
step that logs nothing runs with none of ours (real transformers.Trainer, lightning.Trainer and
a plain loop with SpectralTracker, tiny GPT-2 built offline, CPU), and the logged values are
the ones a probe attached for the whole run gives."""

import collections

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from spectral_hooks.hooks.taps import count_taps
from spectral_hooks.integrations import SpectralCallback, SpectralTracker


def tiny():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                      n_positions=64, bos_token_id=0, eos_token_id=0))


def ours(model):
    """Forward and forward-pre hooks of a spectral_hooks probe on any module of ``model``, and
    its taps (``spectral_hooks/hooks/taps.py``)."""
    probe_hooks = sum(getattr(hook, "__qualname__", "").startswith("Probe.")
                      for m in model.modules()
                      for hook in [*m._forward_hooks.values(), *m._forward_pre_hooks.values()])
    return count_taps(model, detached=True) + probe_hooks


def count_per_step(model, step_of):
    """step -> [our hooks at each training forward of that step], and the same for evaluation
    forwards (model in eval mode); ``step_of()`` names the running step."""
    seen, evaluation = collections.defaultdict(list), collections.defaultdict(list)

    def count(module, args):
        (seen if module.training else evaluation)[step_of()].append(ours(model))

    return seen, evaluation, model.register_forward_pre_hook(count)


# ---------------------------------------------------------------- HF Trainer
class KeepAttached(TrainerCallback):
    """The reference: the callback's probe attached at every step (the old behaviour)."""

    def __init__(self, callback):
        self.callback = callback

    def on_step_begin(self, args, state, control, **kwargs):
        self.callback.probe.attach()


def hf_train(tmp_path, every, *, steps, accumulation=1, reference=False, evaluate=False):
    model = tiny()
    data = [{"input_ids": ids, "labels": ids}
            for ids in torch.randint(0, 100, (48, 10), generator=torch.Generator().manual_seed(1))]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=steps,
                             per_device_train_batch_size=2,
                             gradient_accumulation_steps=accumulation, learning_rate=1e-3,
                             logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                             seed=0, disable_tqdm=True, dataloader_num_workers=0,
                             eval_strategy="steps" if evaluate else "no", eval_steps=1,
                             per_device_eval_batch_size=4)
    callback = SpectralCallback(every=every)
    callbacks = [callback, KeepAttached(callback)] if reference else [callback]
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      eval_dataset=data[:4] if evaluate else None, callbacks=callbacks)
    seen, evaluation, handle = count_per_step(model, lambda: trainer.state.global_step + 1)
    trainer.train()
    handle.remove()
    assert ours(model) == 0
    assert not evaluate or sum(map(len, evaluation.values())) == steps
    if not reference:  # never in evaluation
        assert all(n == 0 for counts in evaluation.values() for n in counts)
    return seen, callback.history


def test_trainer_every_50_no_hooks_on_steps_that_log_nothing(tmp_path):
    seen, history = hf_train(tmp_path, 50, steps=3)
    assert sorted(seen) == [1, 2, 3] and all(len(v) == 1 for v in seen.values())
    assert all(n == 0 for counts in seen.values() for n in counts)
    assert history == []


def test_trainer_hooks_only_in_logged_steps_with_accumulation_and_evaluation(tmp_path):
    seen, history = hf_train(tmp_path / "a", 2, steps=4, accumulation=2, evaluate=True)
    assert all(len(seen[step]) == 2 for step in (1, 2, 3, 4))  # two micro-batches each
    for step in (1, 3):
        assert all(n == 0 for n in seen[step]), (step, seen[step])
    for step in (2, 4):
        assert all(n > 0 for n in seen[step]), (step, seen[step])
    assert [step for step, _ in history] == [2, 4]
    _, reference = hf_train(tmp_path / "b", 2, steps=4, accumulation=2, evaluate=True,
                            reference=True)
    strip = lambda h: [(s, {k: v for k, v in m.items() if k != "spectral/seconds"})  # noqa: E731
                       for s, m in h]
    assert strip(history) == strip(reference)


# ---------------------------------------------------------------- Lightning
def test_lightning_hooks_only_in_logged_steps():
    pl = pytest.importorskip("lightning.pytorch")
    from spectral_hooks.integrations.lightning import SpectralLightningCallback

    class LM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny()

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch, labels=batch).loss

        def validation_step(self, batch, batch_idx):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def fit(every):
        module = LM()
        data = torch.randint(0, 100, (32, 10), generator=torch.Generator().manual_seed(1))
        loader = torch.utils.data.DataLoader(data, batch_size=2)
        callback = SpectralLightningCallback(every=every)
        trainer = pl.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False,
                             callbacks=[callback], enable_progress_bar=False,
                             enable_checkpointing=False, enable_model_summary=False,
                             accumulate_grad_batches=2, val_check_interval=2,
                             limit_val_batches=1, num_sanity_val_steps=0)
        seen, evaluation, handle = count_per_step(module.model, lambda: trainer.global_step + 1)
        trainer.fit(module, loader, loader)
        handle.remove()
        assert ours(module.model) == 0
        assert evaluation and all(n == 0 for counts in evaluation.values() for n in counts)
        return seen, callback.history

    seen, history = fit(50)
    assert all(n == 0 for counts in seen.values() for n in counts) and history == []
    seen, history = fit(2)
    assert [step for step, _ in history] == [2, 4]
    assert all(n == 0 for step in (1, 3) for n in seen[step])
    assert all(len(seen[step]) == 2 for step in (1, 2, 3, 4))  # two micro-batches each
    assert all(n > 0 for step in (2, 4) for n in seen[step])


# ---------------------------------------------------------------- plain loop
@pytest.mark.parametrize("every", [3, 50])
def test_tracker_hooks_only_in_logged_steps(every):
    model = tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 100, (24, 8), generator=torch.Generator().manual_seed(1))
    tracker = SpectralTracker(model, every=every)
    step = 1
    seen, _, handle = count_per_step(model, lambda: step)
    logged = {}
    for step in range(1, 7):
        batch = data[(step - 1) * 4:step * 4]
        model(batch, labels=batch).loss.backward()
        logged[step] = tracker.step(step)
        optimizer.step()
        optimizer.zero_grad()
    handle.remove()
    tracker.close()
    assert ours(model) == 0
    due = {s for s in range(1, 7) if s % every == 0}
    assert {s for s, counts in seen.items() if counts[0] > 0} == due
    assert {s for s, m in logged.items() if m} == due
