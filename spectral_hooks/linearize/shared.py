"""One traced JVP graph for every block of the same structure (batched single-query JVPs).

``torch.func.linearize`` traces the block anew for every layer (~0.5-1.5 s on a GPT-2-small
block, as long as ~100-300 one-column JVPs). Here the JVP of :meth:`SingleQueryFunction.batched_with` is
traced once with *every* tensor it reads (parameters, fixed keys/values, mask, rotary tables,
the input rows and the tangent) as graph inputs, and the graph is split in two:

* ``primal``: the nodes that do not depend on the tangent, returning those the tangent part
  reads (run once per layer: one batched forward);
* ``tangent``: the rest, a function of those residuals and the tangent (run per matmat).

The VJP is the transpose of ``tangent`` (a linear map of the tangent): ``make_fx`` of its
``torch.func.vjp``, traced once per tangent graph and checked per block like the JVP; its run
is plain aten ops (no autograd engine), so on a GPU it can be replayed from a CUDA graph.

Blocks of one structure (same module class, input names, shapes and dtypes) reuse the graph.
Python-level facts a trace bakes in (a layer index in a scale, a sliding window) can differ
between such blocks, so every reuse is checked against a direct ``torch.func.jvp`` of the
block: the first products through it, on a random combination of their columns
(:func:`disagreement`, one direct JVP, no extra pass of the graph); a block that disagrees gets
its own trace (used once, not cached) and those products are computed again.

The module-level cache (``_TRACES``, at most ``_MAX_TRACES`` graphs) keeps nothing of a model
or a recording alive: its keys hold a block *class* and shapes, and a graph is cached only if
no tensor it holds (constants lifted by the trace) shares storage with the block's parameters,
buffers or recorded inputs, which are graph inputs, passed anew on every call.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

import torch
from torch import Tensor, fx
from torch.autograd import forward_ad as fwAD
from torch.fx.experimental.proxy_tensor import make_fx

from .function import agreement_tol, math_sdpa, one_snapshot_mode, plain_jvp
from .zero_terms import drop_zero_terms

if TYPE_CHECKING:
    from .single_query import SingleQueryFunction

log: logging.Logger = logging.getLogger("spectral_hooks.linearize")
_TRACES: "OrderedDict[tuple, Tuple[fx.GraphModule, fx.GraphModule]]" = OrderedDict()
_MAX_TRACES = 8


def _signature(fn, inputs: List[Tensor], width: int, extra=()) -> tuple:
    # the block's repr names what shapes do not (activation functions, norm epsilons,
    # dropout), the anatomy's replay kind what the repr does not (a sliding window, NoPE):
    # blocks of one class and shape that compute differently do not share a graph (the
    # per-layer checks would catch it, at the cost of a fallback)
    return (type(fn.block), repr(fn.block), fn.full_fn.replay_kind, tuple(fn.params), fn.split,
            width, fn._p,
            str(fn._spec), tuple((tuple(t.shape), t.dtype, t.device) for t in inputs), *extra)


def _trace(fn, inputs: List[Tensor], X0: Tensor) -> Tuple[fx.GraphModule, fx.GraphModule]:
    n = len(inputs)

    def jvp_graph(*flat):
        ins, x0, tangent = list(flat[:n]), flat[n], flat[n + 1]
        with fwAD.dual_level():
            out = fn.batched_with(ins, fwAD.make_dual(x0, tangent))
            t = fwAD.unpack_dual(out).tangent
        return torch.zeros_like(out) if t is None else t

    with math_sdpa(), one_snapshot_mode():
        gm = make_fx(jvp_graph)(*inputs, X0, torch.zeros_like(X0))
    drop_zero_terms(gm.graph)  # the weights' zero tangents: mm(x, 0) terms (zero_terms.py)
    return _split(gm)


def _split(gm: fx.GraphModule) -> Tuple[fx.GraphModule, fx.GraphModule]:
    """(primal, tangent) graphs: the tangent is the last placeholder."""
    nodes = list(gm.graph.nodes)
    tangent_in = [n for n in nodes if n.op == "placeholder"][-1]
    dep = {tangent_in}
    for node in nodes:
        if node.op not in ("placeholder", "output", "get_attr") and any(
                a in dep for a in node.all_input_nodes):
            dep.add(node)
    output = nodes[-1]
    residuals = [n for n in nodes if n not in dep and n.op != "output"
                 and any(u in dep or u is output for u in n.users)]

    primal = fx.Graph()
    env = {}
    for node in nodes:
        if node in dep or node.op == "output":
            continue
        env[node] = primal.node_copy(node, lambda a: env[a])
    primal.output(tuple(env[r] for r in residuals))

    tangent = fx.Graph()
    env2 = {r: tangent.placeholder(f"residual_{i}") for i, r in enumerate(residuals)}
    env2[tangent_in] = tangent.placeholder("tangent")
    for node in nodes:
        if node in dep and node is not tangent_in:
            env2[node] = tangent.node_copy(node, lambda a: env2[a])
    tangent.output(fx.map_arg(output.args[0], lambda a: env2[a]))
    for graph in (primal, tangent):
        _drop_unused(graph)
    return fx.GraphModule(gm, primal), fx.GraphModule(gm, tangent)


def _drop_unused(graph: fx.Graph) -> None:
    """Dead code, including forward-AD bookkeeping (size/storage checks) fx keeps as impure."""
    def impure(node: fx.Node) -> bool:
        schema = getattr(node.target, "_schema", None)
        return node.op in ("placeholder", "output") or bool(schema and schema.is_mutable)
    graph.eliminate_dead_code(is_impure_node=impure)


def _storage(t: Tensor) -> Optional[int]:
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:  # a lifted constant without real storage: it aliases nothing
        return None


def _holds_any(graphs: Tuple[fx.GraphModule, ...], tensors: List[Tensor]) -> bool:
    """True when a graph holds a tensor sharing storage with one of ``tensors``."""
    owned = {_storage(t) for t in tensors} - {None}
    for gm in graphs:
        held = [v for v in vars(gm).values() if isinstance(v, Tensor)]
        held += [t for _, t in gm.named_buffers()] + [t for _, t in gm.named_parameters()]
        if any(_storage(t) in owned for t in held):
            return True
    return False


def clear_traces() -> None:
    """Forget every cached traced graph (the next block of each structure traces anew).

    >>> clear_traces()
    >>> len(_TRACES)
    0
    """
    _TRACES.clear()


def _cached_trace(key: tuple, fn, inputs: List[Tensor], X0: Tensor
                  ) -> Tuple[fx.GraphModule, fx.GraphModule]:
    if key in _TRACES:
        _TRACES.move_to_end(key)
        return _TRACES[key]
    graphs = _trace(fn, inputs, X0)
    if not _holds_any(graphs, [*inputs, *fn.block.parameters(), *fn.block.buffers()]):
        _TRACES[key] = graphs
        while len(_TRACES) > _MAX_TRACES:
            _TRACES.popitem(last=False)
    return graphs


def structure_graphs(fn: SingleQueryFunction, width: int
                     ) -> Tuple[fx.GraphModule, fx.GraphModule]:
    """(primal, tangent): the cached traced graphs of ``fn``'s block structure at ``width``
    columns (traced on first use), as :func:`shared_block_jvp` runs them. ``primal(*inputs,
    X0)`` -> residuals; ``tangent(*residuals, T)`` -> J T."""
    inputs = fn.inputs()
    X0 = fn.x0.expand(width, *fn.x0.shape).contiguous()
    return _cached_trace(_signature(fn, inputs, width), fn, inputs, X0)


def structure_key(fn: SingleQueryFunction, width: int) -> tuple:
    """What a traced graph of ``fn`` depends on: blocks with equal keys share their graphs."""
    return _signature(fn, fn.inputs(), width)


def transposed_graph(tangent: fx.GraphModule, residuals: Tuple[Tensor, ...], width: int,
                     x0: Tensor) -> fx.GraphModule:
    """``transpose(*residuals, U)`` -> J^T U for a tangent graph (traced once per tangent
    graph, kept on it; not checked here: see :meth:`SharedJvp.transpose`)."""
    graph = getattr(tangent, "_spectral_hooks_transpose", None)
    if graph is None:
        graph = _transpose(tangent, residuals, width, x0)
        tangent._spectral_hooks_transpose = graph
    return graph


class SharedJvp:
    """T [width, 1, d] -> J T from a shared traced tangent graph and this block's residuals;
    :meth:`transpose` gives U -> J^T U as a traced graph too."""

    def __init__(self, fn: SingleQueryFunction, tangent: fx.GraphModule,
                 residuals: Tuple[Tensor, ...], width: int, *, own: bool = False) -> None:
        self.fn, self.tangent, self.residuals, self.width = fn, tangent, residuals, width
        self.own = own  # traced for this block alone (not the shared graph of its structure)

    def __call__(self, T: Tensor) -> Tensor:
        return self.tangent(*self.residuals, T)

    def transpose(self) -> Callable[[Tensor], Tensor]:
        """U [width, 1, d] -> J^T U: the reverse-mode graph of the (linear) tangent graph,
        traced once per tangent graph (``make_fx`` of its ``torch.func.vjp``: plain aten ops
        at run time, no autograd engine), checked against ``torch.func.vjp`` of the block on
        two columns; ValueError where it disagrees."""
        width = self.width
        graph = transposed_graph(self.tangent, self.residuals, width, self.fn.x0)

        def vjp(U: Tensor, graph=graph, residuals=self.residuals) -> Tensor:
            return graph(*residuals, U)

        err = _check_transpose(self.fn, vjp, width)
        if err > agreement_tol(self.fn.x0.dtype):
            raise ValueError(f"traced VJP graph of layer {self.fn.layer} disagrees with "
                             f"torch.func.vjp ({err:.1e})")
        return vjp


#: Elementwise ``*_backward(grad, ...)`` ops of forward-AD tangents: linear in ``grad`` but with
#: no derivative for it, so the transpose sees ``grad * op(1, ...)`` instead.
_ELEMENTWISE_BACKWARD = tuple(
    getattr(torch.ops.aten, name).default for name in (
        "silu_backward", "gelu_backward", "tanh_backward", "sigmoid_backward",
        "threshold_backward", "elu_backward", "softplus_backward", "hardtanh_backward",
        "leaky_relu_backward", "hardsigmoid_backward", "hardswish_backward", "mish_backward")
    if hasattr(torch.ops.aten, name))


def _differentiable_in_tangent(tangent: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``tangent`` whose elementwise backward ops are ``grad * op(ones, ...)``."""
    gm = copy.deepcopy(tangent)
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _ELEMENTWISE_BACKWARD:
            with graph.inserting_before(node):
                ones = graph.call_function(torch.ops.aten.ones_like.default, (node.args[0],))
                factor = graph.call_function(node.target, (ones, *node.args[1:]), node.kwargs)
                product = graph.call_function(torch.ops.aten.mul.Tensor, (node.args[0], factor))
            node.replace_all_uses_with(product)
            graph.erase_node(node)
    gm.recompile()
    return gm


def _transpose(tangent: fx.GraphModule, residuals: Tuple[Tensor, ...], width: int,
               x0: Tensor) -> fx.GraphModule:
    tangent = _differentiable_in_tangent(tangent)

    def vjp_graph(*flat):
        res, U = flat[:-1], flat[-1]
        pullback = torch.func.vjp(lambda T: tangent(*res, T), torch.zeros_like(U))[1]
        return pullback(U)[0]

    U0 = x0.expand(width, *x0.shape).contiguous()
    with math_sdpa(), one_snapshot_mode():
        gm = make_fx(vjp_graph)(*residuals, U0)
    _drop_unused(gm.graph)
    gm.recompile()
    return gm


def _check_transpose(fn, vjp: Callable[[Tensor], Tensor], width: int) -> float:
    g = torch.Generator(device="cpu").manual_seed(2)
    U = torch.randn((width, *fn.x0.shape), generator=g, dtype=torch.float64).to(fn.x0)
    got = vjp(U)[:2]
    with math_sdpa():
        pullback = torch.func.vjp(fn, fn.x0)[1]
        want = torch.stack([pullback(u)[0] for u in U[:2]])
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def shared_block_jvp(fn: SingleQueryFunction, width: int, *, own: bool = False) -> SharedJvp:
    """T [width, 1, d] -> J T for a split :class:`SingleQueryFunction` ``fn``: the cached graph
    of its structure (``own=True``: a trace of this block alone, not cached). Not yet checked:
    the caller checks its first products (:func:`disagreement`) before using them."""
    inputs = fn.inputs()
    X0 = fn.x0.expand(width, *fn.x0.shape).contiguous()
    if own:
        primal, tangent = _trace(fn, inputs, X0)
    else:
        primal, tangent = _cached_trace(_signature(fn, inputs, width), fn, inputs, X0)
    with torch.no_grad():
        residuals = primal(*inputs, X0)
    return SharedJvp(fn, tangent, residuals, width, own=own)


def disagreement_terms(fn: SingleQueryFunction, V: Tensor, JV: Tensor, *,
                       adjoint: bool = False) -> Tuple[Tensor, Tensor]:
    """(relative disagreement, ||V c||) as 0-dim tensors, no host read: products ``JV``
    [k, 1, d] of ``V`` [k, 1, d] (J^T V with ``adjoint``) against one direct ``torch.func``
    JVP (VJP) of the block on a random combination V c (J is linear: (J V) c = J (V c)).
    A zero ||V c|| means nothing was checked."""
    g = torch.Generator(device="cpu").manual_seed(3 if adjoint else 1)
    c = torch.randn(V.shape[0], generator=g, dtype=torch.float64).to(V).view(-1, 1, 1)
    v = (V * c).sum(0, keepdim=True)
    if adjoint:
        with math_sdpa():
            want = torch.func.vjp(fn, fn.x0)[1](v[0])[0][None]
    else:
        want = plain_jvp(fn.batched, fn.x0[None])(v)
    got = (JV * c).sum(0, keepdim=True)
    return (got - want).norm() / want.norm().clamp_min(1e-30), v.norm()


def disagreement(fn: SingleQueryFunction, V: Tensor, JV: Tensor) -> Optional[float]:
    """Relative disagreement of products ``JV`` [k, 1, d] of ``V`` [k, 1, d] with a direct
    ``torch.func.jvp`` of the block: J is linear, so one direct JVP of a random combination
    V c checks every column at once ((J V) c against J (V c)). None where V c is zero (nothing
    to check)."""
    g = torch.Generator(device="cpu").manual_seed(1)
    c = torch.randn(V.shape[0], generator=g, dtype=torch.float64).to(V).view(-1, 1, 1)
    v = (V * c).sum(0, keepdim=True)
    if not bool(v.any()):
        return None
    want = plain_jvp(fn.batched, fn.x0[None])(v)
    got = (JV * c).sum(0, keepdim=True)
    return float((got - want).norm() / want.norm().clamp_min(1e-30))
