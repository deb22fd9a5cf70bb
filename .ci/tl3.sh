#!/usr/bin/env bash
# TransformerLens 3 tests in their own venv (.venv-tl3): TL 4 removed HookedTransformer, so
# tests/tl3 run against transformer-lens==3.9.0. Idempotent: the installs are skipped when the
# venv already holds the pinned versions and pyproject.toml has not changed since.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-tl3
PY="$VENV/bin/python"
TORCH=torch==2.13.0            # first, alone: the CPU wheel on this disk (no CUDA build)
TLENS=transformer-lens==3.9.0
TRANSFORMERS=transformers==5.24.0   # TL 3.9 needs >=5.9; 5.24 has GradientCheckpointingLayer
TEST_DEPS=(einops numpy pandas tqdm pytest scipy)

pip_q() {  # quiet pip; drop the local-index "is ignored" warnings this machine's config causes
    "$PY" -m pip install -qq --disable-pip-version-check "$@" 2> >(grep -v "is ignored" >&2)
}

stamp="$VENV/.tl3-stamp"
want="$TORCH $TLENS $TRANSFORMERS ${TEST_DEPS[*]} $(sha256sum pyproject.toml | cut -c1-16) $PWD"

[ -x "$PY" ] || python3 -m venv "$VENV"

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "tl3: installing into $VENV ($TORCH, $TLENS, $TRANSFORMERS)"
    rm -f "$stamp"
    pip_q "$TORCH"
    pip_q "$TORCH" "$TLENS" "$TRANSFORMERS"
    pip_q --no-deps -e .
    pip_q "$TORCH" "$TRANSFORMERS" "${TEST_DEPS[@]}"
    "$PY" - <<'PY'
import importlib.metadata as md
import torch, transformers, transformer_lens, spectral_hooks  # noqa: F401
from transformer_lens import HookedTransformer  # noqa: F401
from transformers.modeling_layers import GradientCheckpointingLayer  # noqa: F401
for name in ("torch", "transformer-lens", "transformers"):
    print(f"tl3: {name}=={md.version(name)}")
PY
    echo "$want" > "$stamp"
fi

export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::DeprecationWarning}"
set +e
"$PY" -m pytest -q -p no:cacheprovider tests/tl3 "$@"
rc=$?
set -e
[ "$rc" -eq 5 ] && { echo "tl3: no tests collected" >&2; exit 1; }
exit "$rc"
