"""SpectralCallback inside a real transformers.Trainer (tiny GPT-2 built offline, CPU)."""

import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from spectral_hooks.hooks.taps import count_hook_points as count_hooks
from spectral_hooks.integrations import JSONLLogger, SpectralCallback, TensorBoardLogger

from .test_loggers import read_tensorboard

STEPS, EVERY = 6, 2


def train(tmp_path, name, callbacks):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                       n_positions=64, bos_token_id=0, eos_token_id=0))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 100, (24, 10), generator=g)
    data = [{"input_ids": ids, "labels": ids} for ids in tokens]
    args = TrainingArguments(output_dir=str(tmp_path / name), max_steps=STEPS,
                             per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1,
                             report_to=[], use_cpu=True, save_strategy="no", seed=0,
                             disable_tqdm=True, dataloader_num_workers=0)
    hooks_before = count_hooks(model)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    trainer.train()
    assert count_hooks(model) == hooks_before  # nothing left behind
    return model, trainer.state.log_history


def test_callback_logs_and_leaves_training_unchanged(tmp_path):
    jsonl = JSONLLogger(tmp_path / "spectral.jsonl")
    tb = TensorBoardLogger(tmp_path / "tb")
    callback = SpectralCallback(every=EVERY, loggers=[jsonl, tb], close_loggers=True)
    model, history = train(tmp_path, "with", [callback])
    plain, plain_history = train(tmp_path, "without", [])
    assert callback.probe is None

    # training is bit-identical: per-step losses and final weights
    losses = [(h["step"], h["loss"]) for h in history if "loss" in h]
    assert len(losses) == STEPS
    assert losses == [(h["step"], h["loss"]) for h in plain_history if "loss" in h]
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert torch.equal(p, q), name

    # logged at steps 2, 4, 6: JSONL, TensorBoard and state.log_history agree
    rows = [json.loads(line) for line in (tmp_path / "spectral.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6]
    keys = {f"spectral/layer_{l:02d}/{c}" for l in (0, 1)
            for c in ("gap_ratio", "gamma", "lift", "abs_lambda1", "erank")}
    keys.add("spectral/seconds")  # the cost of each logging event, logged with it
    assert all(set(r) - {"step"} == keys for r in rows)
    scalars = read_tensorboard(tmp_path / "tb")
    assert set(scalars) == keys
    for key in keys:
        assert [s for s, _ in scalars[key]] == [2, 4, 6]
        assert [v for _, v in scalars[key]] == pytest.approx([r[key] for r in rows])
    entries = [h for h in history if "spectral/layer_00/gamma" in h]
    assert [h["step"] for h in entries] == [2, 4, 6]
    assert all("epoch" in h for h in entries)
    for h, r in zip(entries, rows):
        assert {k: h[k] for k in keys} == {k: r[k] for k in keys}
    # metrics move as the weights train
    assert rows[0]["spectral/layer_00/abs_lambda1"] != rows[-1]["spectral/layer_00/abs_lambda1"]


def test_callback_validates_options():
    with pytest.raises(ValueError, match="every"):
        SpectralCallback(every=0)
    with pytest.raises(ValueError, match="window"):
        SpectralCallback(window="epoch")
    with pytest.raises(ValueError, match="stats"):
        SpectralCallback(store="stats")
    with pytest.raises(TypeError):
        SpectralCallback(loggers=[object()])


def _train_with_report_to(tmp_path, name, attach: bool, every: int = EVERY):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                       n_positions=64, bos_token_id=0, eos_token_id=0))
    tokens = torch.randint(0, 100, (24, 10), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": ids, "labels": ids} for ids in tokens]
    args = TrainingArguments(output_dir=str(tmp_path / name), max_steps=STEPS,
                             per_device_train_batch_size=4, learning_rate=1e-3,
                             logging_steps=5, report_to=["tensorboard"], use_cpu=True,
                             save_strategy="no", seed=0, disable_tqdm=True,
                             dataloader_num_workers=0)
    callback = SpectralCallback(every=every)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=None if attach else [callback])
    if attach:
        assert callback.attach(trainer) is callback
    trainer.train()
    trainer.callback_handler.on_train_end(args, trainer.state, trainer.control)  # flush TB
    return trainer, callback


def _scalars(root) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for events in root.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out[tag] = [e.step for e in acc.Scalars(tag)]
    return out


def test_attach_reaches_the_trainers_report_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    trainer, callback = _train_with_report_to(tmp_path, "attached", attach=True)
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert names.index("SpectralCallback") < names.index("TensorBoardCallback")
    scalars = _scalars(tmp_path / "attached")
    spectral = {tag: steps for tag, steps in scalars.items() if "spectral/" in tag}
    # the Trainer's TensorBoard integration prefixes training logs with "train/"
    assert "train/spectral/layer_01/gap_ratio" in spectral, sorted(scalars)
    assert len(spectral) == 11 and all(steps == [2, 4, 6] for steps in spectral.values())
    assert scalars["train/loss"][:1] == [2]  # the Trainer logged at our steps too
    entries = [h for h in trainer.state.log_history if "spectral/layer_00/gamma" in h]
    assert [h["step"] for h in entries] == [2, 4, 6] and all("loss" in h for h in entries)


def test_callbacks_list_alone_misses_report_to(tmp_path):
    pytest.importorskip("tensorboard")
    trainer, callback = _train_with_report_to(tmp_path, "listed", attach=False)
    scalars = _scalars(tmp_path / "listed")
    assert not any("spectral/" in tag for tag in scalars)  # why attach() exists
    assert [step for step, _ in callback.history] == [2, 4, 6]  # but it did compute them
