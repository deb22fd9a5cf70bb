"""SpectralTracker in a plain training loop: logs at due steps, returns None otherwise, leaves
training bit-identical and no hooks behind."""

import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from spectral_hooks.hooks.taps import count_hook_points as count_hooks
from spectral_hooks.integrations import JSONLLogger, SpectralTracker


def loop(tmp_path, track: bool):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                       n_positions=64, bos_token_id=0, eos_token_id=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 100, (16, 8), generator=torch.Generator().manual_seed(1))
    tracker = SpectralTracker(model, every=2, loggers=[JSONLLogger(tmp_path / "s.jsonl")]) \
        if track else None
    returned = []
    for step in range(1, 5):
        batch = data[(step - 1) * 4:step * 4]
        model(batch, labels=batch).loss.backward()
        if tracker is not None:
            returned.append(tracker.step(step))
            assert not tracker.probe.recording.steps  # cleared every step
        optimizer.step()
        optimizer.zero_grad()
    if tracker is not None:
        tracker.close()
    return model, returned


def test_plain_loop(tmp_path):
    model, returned = loop(tmp_path, track=True)
    plain, _ = loop(tmp_path / "plain", track=False)
    assert [r is None for r in returned] == [True, False, True, False]
    assert returned[1]["spectral/seconds"] > 0 and "spectral/layer_01/gap_ratio" in returned[1]
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4]
    for p, q in zip(model.parameters(), plain.parameters()):
        assert torch.equal(p, q)
    assert count_hooks(model) == 0
