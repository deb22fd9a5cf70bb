"""The examples in the docstrings of the recording side (recording/, probe, hooks/,
encoder_decoder, the training integrations) run: doctest on tiny models built from configs, offline."""

import doctest
import importlib

import pytest

MODULES = ["spectral_hooks.recording", "spectral_hooks.recording.core",
           "spectral_hooks.recording.points", "spectral_hooks.recording.block_call",
           "spectral_hooks.recording.cache_view", "spectral_hooks.recording.patterns",
           "spectral_hooks.recording.running_stats", "spectral_hooks.recording.suspend",
           "spectral_hooks.probe", "spectral_hooks.hooks", "spectral_hooks.hooks.forward_call",
           "spectral_hooks.hooks.taps",
           "spectral_hooks.encoder_decoder", "spectral_hooks.integrations.tracker",
           "spectral_hooks.integrations.hf_trainer", "spectral_hooks.integrations.lightning"]


@pytest.mark.parametrize("name", MODULES)
def test_module_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             extraglobs={"torch": importlib.import_module("torch")})
    assert result.failed == 0, f"{name}: {result}"


def test_no_skipped_examples():
    for name in MODULES:
        source = importlib.util.find_spec(name).origin
        assert "doctest: +SKIP" not in open(source).read(), name
