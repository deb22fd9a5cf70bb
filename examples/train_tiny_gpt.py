"""Train a tiny GPT-2-style model from scratch on CPU, saving checkpoints for the case study.

The corpus is available on every machine without a download: the docstrings of the Python
standard library of the interpreter that runs this script (``ast.get_docstring`` over every
``.py`` file under ``sysconfig.get_paths()["stdlib"]``, in sorted order), as UTF-8 bytes. The
model reads bytes (vocabulary 256), so no tokenizer is needed.

Run (a few minutes a seed on one CPU thread at the defaults):

    python examples/train_tiny_gpt.py --out runs/tiny_gpt --seeds 0 1 2

Each seed writes ``<out>/seed_<s>/step_<n>/`` (``save_pretrained``) at the steps in
``--checkpoints`` (step 0 is the initialisation) and ``<out>/seed_<s>/log.json`` with the
training and held-out losses. ``examples/case_study_training.py`` analyses them.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sysconfig
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

#: The default model: 4 layers, d = 128 (GPT-2 layout, byte vocabulary, no dropout).
CONFIG = dict(vocab_size=256, n_positions=128, n_embd=128, n_layer=4, n_head=4,
              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
              eos_token_id=None)
QUICK_CONFIG = dict(CONFIG, n_embd=64, n_layer=2, n_head=2)


def stdlib_docstrings(max_bytes: int | None = None) -> bytes:
    """Every module, class and function docstring of the standard library, joined by blank lines."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[str] = []
    size = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are Python-2 test data or other encodings
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    chunks.append(doc)
                    size += len(doc) + 2
        if max_bytes is not None and size >= max_bytes:
            break
    return "\n\n".join(chunks).encode("utf-8")


def split_corpus(data: bytes, held_out: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    cut = int(len(ids) * (1 - held_out))
    return ids[:cut], ids[cut:]


def batches(ids: torch.Tensor, batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - seq - 1, (batch,), generator=generator)
    return torch.stack([ids[s:s + seq] for s in starts.tolist()])


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return 0.5 * peak * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


@torch.no_grad()
def held_out_loss(model: GPT2LMHeadModel, ids: torch.Tensor, seq: int, n: int = 16) -> float:
    g = torch.Generator().manual_seed(1234)  # the same held-out windows for every checkpoint
    x = batches(ids, n, seq, g)
    return float(model(input_ids=x, labels=x).loss)


def train_seed(seed: int, train: torch.Tensor, valid: torch.Tensor, *, out: Path, config: dict,
               steps: int, checkpoints: list[int], batch: int, seq: int, lr: float) -> dict:
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**config))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(10_000 + seed)
    log: dict = {"seed": seed, "config": config, "steps": steps, "losses": [], "held_out": {}}
    start = time.perf_counter()
    for step in range(steps + 1):
        if step in checkpoints:
            model.eval()
            log["held_out"][step] = held_out_loss(model, valid, seq)
            model.save_pretrained(out / f"seed_{seed}" / f"step_{step}")
            print(f"seed {seed} step {step:5d}  held-out loss {log['held_out'][step]:.3f}  "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
            model.train()
        if step == steps:
            break
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, steps, lr, warmup=max(1, steps // 20))
        x = batches(train, batch, seq, g)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        log["losses"].append(float(loss.detach()))
    log["seconds"] = time.perf_counter() - start
    (out / f"seed_{seed}" / "log.json").write_text(json.dumps(log))
    return log


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/tiny_gpt"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--checkpoints", type=int, nargs="+", default=None,
                        help="steps to save (default: 0, steps/8, steps/4, steps/2, steps)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="a 2-layer d=64 model, 40 steps, a small corpus (for the tests)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    config, steps = (QUICK_CONFIG, 40) if args.quick else (CONFIG, args.steps)
    checkpoints = args.checkpoints or sorted({0, steps // 8, steps // 4, steps // 2, steps})
    data = stdlib_docstrings(max_bytes=200_000 if args.quick else None)
    train, valid = split_corpus(data)
    print(f"corpus: {len(data) / 1e6:.1f} MB of standard-library docstrings "
          f"({len(train)} train / {len(valid)} held-out bytes)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    return [train_seed(s, train, valid, out=args.out, config=config, steps=steps,
                       checkpoints=checkpoints, batch=args.batch, seq=args.seq, lr=args.lr)
            for s in args.seeds]


if __name__ == "__main__":
    main()
