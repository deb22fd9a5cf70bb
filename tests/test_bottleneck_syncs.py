"""Issue 37: the matrix-free bottleneck section on a real (tiny) model reads the host once per
solver check, not once per block application: the solvers test the chain's products on the
device (``caller_checks_finite`` reaches every block of a composite operator), and a NaN that
arises inside a block still raises the block's own error."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import spectral_hooks as sh
from spectral_hooks.analysis import AnalyzeOptions
from spectral_hooks.analysis.bottleneck import bottleneck_section
from spectral_hooks.errors import NonFiniteComputationError
from tests.host_reads import host_reads
from tests.tiny_models import make_model

OPTIONS = AnalyzeOptions(power=False, bottleneck=True, progress=False,
                         jacobian={"k": 4, "dense": False, "bottleneck_dense": False,
                                   "bottleneck_k": 4, "bottleneck_probes": 4,
                                   "bottleneck_steps": 16, "ablations": ("symmetric",)})


def _probe():
    model = make_model("llama", dtype=torch.float32)
    probe = sh.instrument(model)
    with torch.no_grad():
        model(torch.randint(1, 100, (1, 6), generator=torch.Generator().manual_seed(0)))
    return probe


def _reads_and_applications(probe) -> tuple[int, int]:
    from spectral_hooks.linearize import engine

    applied = [0]
    saved = engine.Engine.jvp, engine.Engine.vjp

    def counted(f):
        def g(self, *a, **k):
            applied[0] += 1
            return f(self, *a, **k)
        return g
    engine.Engine.jvp, engine.Engine.vjp = counted(saved[0]), counted(saved[1])
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            bottleneck_section(probe.subject, OPTIONS)
    finally:
        engine.Engine.jvp, engine.Engine.vjp = saved
    return host_reads(prof.events()), applied[0]


def test_block_applications_inside_the_section_do_not_read_the_host():
    probe = _probe()
    bottleneck_section(probe.subject, OPTIONS)  # builds the operators and traces
    reads, applications = _reads_and_applications(probe)
    assert applications > 100
    # before: more than one read per block application (each block tested its own output;
    # 1,334 reads for 1,064 applications), now ~30
    assert reads < 0.1 * applications, (reads, applications)
    probe.remove()


def test_a_nan_inside_a_chain_still_raises_a_clear_error():
    probe = _probe()
    block = probe.anatomy.layers[1].block
    with torch.no_grad():
        block.mlp.down_proj.weight.mul_(float("inf"))
    probe.invalidate()
    # the solver finds the chain's product non-finite; the chain names the block at fault
    with pytest.raises(NonFiniteComputationError, match="block 1 at sample 0"):
        bottleneck_section(probe.subject, OPTIONS)
    probe.remove()
