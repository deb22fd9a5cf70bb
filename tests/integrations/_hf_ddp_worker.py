"""One rank of test_hf_ddp.py: a real transformers ``Trainer`` under 2-process DDP (gloo, CPU;
the rank comes from RANK/WORLD_SIZE/LOCAL_RANK as torchrun would set them), trained with
``SpectralCallback(...).attach(trainer)`` and report_to=["tensorboard"], then without the
callback. Writes its final weights and what the callback computed.

    python _hf_ddp_worker.py RANK WORLD_SIZE OUT_DIR
"""

import os
import sys
from pathlib import Path

STEPS, EVERY = 4, 2
COLUMNS = ("gap_ratio", "gamma", "erank", "n_tokens")


def train(out: Path, name: str, attach: bool):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from spectral_hooks.integrations import SpectralCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                       n_positions=64, bos_token_id=0, eos_token_id=0))
    tokens = torch.randint(0, 100, (16, 6), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": ids, "labels": ids} for ids in tokens]
    args = TrainingArguments(output_dir=str(out / name), max_steps=STEPS,
                             per_device_train_batch_size=2, learning_rate=1e-3,
                             logging_steps=5, report_to=["tensorboard"], use_cpu=True,
                             ddp_backend="gloo", save_strategy="no", seed=0, disable_tqdm=True,
                             dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    callback = SpectralCallback(every=EVERY, columns=COLUMNS).attach(trainer) if attach else None
    trainer.train()
    trainer.callback_handler.on_train_end(args, trainer.state, trainer.control)  # flush TB
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return weights, (callback.history if callback is not None else None), trainer


def main(rank: int, world: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch
    import torch.distributed as dist

    out_dir = Path(out)
    with_cb, history, trainer = train(out_dir, "with", attach=True)
    assert dist.is_initialized() and dist.get_world_size() == world
    wrapped = type(trainer.model_wrapped).__name__
    without, _, _ = train(out_dir, "without", attach=False)
    torch.save({"with": with_cb, "without": without, "history": history, "wrapped": wrapped},
               out_dir / f"hf{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
