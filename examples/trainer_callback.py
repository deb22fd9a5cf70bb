"""Spectral metrics logged by a Hugging Face Trainer callback (tiny GPT-2 built offline).

Run: python examples/trainer_callback.py [out_dir]     (TensorBoard: tensorboard --logdir out_dir)
"""

import json
import sys
import tempfile
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from spectral_hooks.integrations import JSONLLogger, SpectralCallback, TensorBoardLogger

scratch = tempfile.TemporaryDirectory()  # used when no out_dir is given
out = Path(sys.argv[1] if len(sys.argv) > 1 else scratch.name)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                   n_positions=64, bos_token_id=0, eos_token_id=0))
data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 100, (24, 12))]

callback = SpectralCallback(every=2, columns=("abs_lambda1", "gap_ratio", "gamma", "lift"),
                            loggers=[JSONLLogger(out / "spectral.jsonl"),
                                     TensorBoardLogger(out / "tensorboard")],
                            close_loggers=True)
args = TrainingArguments(output_dir=str(out / "trainer"), max_steps=6,
                         per_device_train_batch_size=4, learning_rate=1e-3, report_to=[],
                         use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=2)
Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()

for line in (out / "spectral.jsonl").read_text().splitlines():   # one line per logged step
    row = json.loads(line)
    print(row["step"], {k.split("/", 1)[1]: round(v, 4) for k, v in row.items() if k != "step"})
if len(sys.argv) > 1:
    print("written to", out)
scratch.cleanup()
