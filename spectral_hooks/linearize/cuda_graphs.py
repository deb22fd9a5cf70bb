"""Replay a block's batched JVP / VJP from a CUDA graph: one launch per application, not ~300.

On a GPU an iterative solver's time is host time: measured on an H200 (Llama-3-8B block,
``benchmarks/jacobian_parts.py``, 2026-12-04), ``eigs`` spent 2.5 s of CPU dispatching ~29,000
kernel launches for 0.3 s of GPU work, most of them the ~300 ops of the traced JVP graph run
once per application. A CUDA graph captured once per operator and input shape replays them
with one launch.

    g = graphed(f, example, what="JVP")   # f: a pure function of one CUDA tensor
    g(x)                                  # x of example's shape: copy in, replay, copy out

Measured there: the section's 32 layers 145 s -> 103 s, the same numbers. A capture needs a
function without host syncs or host tensors; one that cannot be captured (``RuntimeError`` from
the capture) is applied as before, and the fallback is reported (``linearize.no_cuda_graph``).
VJPs are captured as the transposed traced graph (``shared.SharedJvp.transpose``: plain aten
ops); a ``torch.func.vjp`` closure cannot be: its backward runs on the streams its forward ran
on, outside the capture stream (on the H200: ``cudaErrorStreamCaptureInvalidated``, and
functorch then unable to vmap the VJP). Each graph holds a private memory pool for its
intermediates (freed with the operator). ``CUDA_GRAPHS = False`` turns replays off.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import Tensor

from ..errors import fallback

log: logging.Logger = logging.getLogger("spectral_hooks.linearize")
#: Replay block JVPs / VJPs on CUDA devices from captured graphs (see the module docstring).
CUDA_GRAPHS = True


def wanted(x: Tensor) -> bool:
    """True where ``x``'s device can replay graphs and replays are on."""
    return CUDA_GRAPHS and x.device.type == "cuda"


def graphed(fn: Callable[[Tensor], Tensor], example: Tensor, *, what: str
            ) -> Callable[[Tensor], Tensor]:
    """``fn`` replayed from a CUDA graph for inputs of ``example``'s shape and dtype (others
    are applied directly); ``fn`` itself where the capture fails."""
    static_in = torch.zeros_like(example)
    device = example.device
    with torch.cuda.device(device):  # a model spread over GPUs: capture on the block's own
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture: lazy library set-up
            fn(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                static_out = fn(static_in)
        except RuntimeError as err:  # an op that syncs with the host or reads host memory
            log.info("CUDA graph capture of the %s failed (%s): applied directly", what, err)
            fallback("linearize.no_cuda_graph",
                     f"the {what} could not be captured in a CUDA graph ({err}): each "
                     "application launches its kernels one by one (slower on a GPU, same "
                     "numbers)")
            return fn

    def replay(x: Tensor) -> Tensor:
        if x.shape != static_in.shape or x.dtype != static_in.dtype:
            return fn(x)
        with torch.cuda.device(device):
            static_in.copy_(x)
            graph.replay()
            return static_out.clone()  # the next replay overwrites static_out

    return replay
