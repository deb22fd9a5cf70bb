"""The CLI on base checkpoints as ``save_pretrained`` writes them (GPT-2, Llama, Mistral,
Qwen3, Gemma; real tokenizer classes built offline, no pad token): exit 0 and a report; bad
inputs exit 2 with one line naming what is wrong."""

import shutil

import pytest
import torch

from spectral_hooks.cli import encode, main
from spectral_hooks.report import Report
from tests.cli.checkpoints import FAMILIES, write_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {family: write_checkpoint(family, root / family) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_analyze_a_base_checkpoint_without_pad_token(family, checkpoints, tmp_path, capsys):
    path = checkpoints[family]
    config_before = (path / "tokenizer_config.json").read_text()
    out = tmp_path / "rep"
    code = main(["analyze", "--model", str(path), "--text", "hello world",
                 "--text", "The quick brown fox jumps over the lazy dog.", "--no-figures",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "internal error" not in captured.err
    assert (out / "report.html").is_file() and (out / "metadata.json").is_file()
    assert "gap_ratio" in captured.out
    assert (path / "tokenizer_config.json").read_text() == config_before  # nothing written back
    saved = Report.load(out)
    assert saved.metadata["texts"] == ["hello world",
                                       "The quick brown fox jumps over the lazy dog."]
    power = saved.power
    assert power is not None and power["layer"].tolist() == [0, 1]


def test_one_text_alone(checkpoints, tmp_path):
    assert main(["analyze", "--model", str(checkpoints["qwen3"]), "--text", "hello world",
                 "--no-figures", "--out", str(tmp_path / "rep")]) == 0


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_padding_without_pad_token_leaves_real_tokens_as_run_alone(family, checkpoints):
    from transformers import AutoModel, AutoTokenizer

    path = checkpoints[family]
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    texts = ["hello world", "Paris is the capital of France."]
    batch = encode(tokenizer, texts, max_length=64)
    assert tokenizer.pad_token is None  # the tokenizer is left as it was
    assert batch["attention_mask"][0].sum() < batch["attention_mask"][1].sum()
    assert batch["input_ids"][0, -1] == tokenizer.eos_token_id  # padded on the right with EOS
    with torch.no_grad():
        together = model(**batch).last_hidden_state
        for row, text in enumerate(texts):
            alone = tokenizer(text, return_tensors="pt")
            n = alone["input_ids"].shape[1]
            assert int(batch["attention_mask"][row].sum()) == n
            torch.testing.assert_close(together[row, :n], model(**alone).last_hidden_state[0],
                                       atol=1e-5, rtol=1e-5)


def test_a_left_padding_tokenizer_is_padded_on_the_right(checkpoints):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoints["llama"], local_files_only=True)
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.eos_token, "left"
    batch = encode(tokenizer, ["hello world", "Paris is the capital of France."],
                   max_length=64)
    assert batch["attention_mask"][0, 0] == 1 and batch["attention_mask"][0, -1] == 0
    assert tokenizer.padding_side == "left"  # left as it was


def test_max_length_truncates_without_pad_token(checkpoints):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoints["gpt2"], local_files_only=True)
    batch = encode(tokenizer, ["The quick brown fox jumps over the lazy dog."], max_length=3)
    assert batch["input_ids"].shape == (1, 3)


def _bad(kind: str, checkpoints, tmp_path) -> list[str]:
    gpt2 = checkpoints["gpt2"]
    if kind == "missing dir":
        return ["--model", str(tmp_path / "nowhere")]
    if kind == "dir without a model":
        (tmp_path / "empty").mkdir()
        return ["--model", str(tmp_path / "empty")]
    if kind == "config without weights":
        (tmp_path / "config_only").mkdir()
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(gpt2 / name, tmp_path / "config_only" / name)
        return ["--model", str(tmp_path / "config_only")]
    if kind == "no tokenizer":
        return ["--model", str(write_checkpoint("gpt2", tmp_path / "bare", tokenizer=False))]
    if kind == "tokenizer dir without tokenizer":
        (tmp_path / "empty").mkdir()
        return ["--model", str(gpt2), "--tokenizer", str(tmp_path / "empty")]
    if kind == "empty text":
        return ["--model", str(gpt2), "--text", "  "]
    if kind == "empty text file":
        (tmp_path / "texts.txt").write_text("\n\n")
        return ["--model", str(gpt2), "--text-file", str(tmp_path / "texts.txt")]
    raise ValueError(kind)


@pytest.mark.parametrize("kind,message", [
    ("missing dir", "not found"),
    ("dir without a model", "no config.json"),
    ("config without weights", "cannot load a model"),
    ("no tokenizer", "has no tokenizer"),
    ("tokenizer dir without tokenizer", "--tokenizer"),
    ("empty text", "empty"),
    ("empty text file", "empty"),
])
def test_bad_input_exits_2_with_one_line(kind, message, checkpoints, tmp_path, capsys):
    argv = ["analyze", *_bad(kind, checkpoints, tmp_path), "--no-figures",
            "--out", str(tmp_path / "rep")]
    capsys.readouterr()  # what building the inputs printed
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert "internal error" not in err
