"""A pipeline's random draws as one process draws them.

One process running the model on a mini-batch draws each dropout mask (bernoulli_ on an
empty_like) and each per-sample draw (rand: stochastic depth) once, over the whole mini-batch,
in graph order. A pipeline runs every node once per micro-batch, on its stage's rank, in
schedule order: drawn there, the masks would be other masks, and a loss with dropout on would
not be the loss one process computes with the same seed.

So at the start of a step every rank replays one process's draws, in the order of the whole
model's graph, from the generator state every rank shares: each draw over the step's whole
batch, kept where this rank's stage reads it and dropped otherwise (so the generator advances as
one process's does, and all ranks stay in step). A stage's draw node becomes a `_Draw` module that
takes the micro-batch's rows of the kept draw. Every rank pays the whole model's draws, not its
stage's: on CPU the generator has no skip-ahead to price them more cheaply.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from ..runtime.spmd_ops import apply_dropout_mask, drawn_value, draws_of

log = logging.getLogger("torch_plugin.pipeline")

_ATEN = torch.ops.aten
# The draws replayed (DRAWS, runtime/spmd_ops.py): dropout masks and per-sample draws. Other
# random ops draw per micro-batch (logged when a stage has one).
_RANDOM = (
    _ATEN.bernoulli.default,
    _ATEN.bernoulli.p,
    _ATEN.bernoulli_.Tensor,
    _ATEN.randn.default,
    _ATEN.randint.default,
    _ATEN.randint.low,
    _ATEN.randperm.default,
    _ATEN.normal_.default,
    _ATEN.uniform_.default,
    _ATEN.exponential_.default,
)


# Random calls a module-level graph can hold (torch.fx keeps torch.nn modules and functions
# as they are called): what one stage's run draws per micro-batch.
_RANDOM_CALLS = frozenset(
    {
        torch.bernoulli,
        torch.rand,
        torch.rand_like,
        torch.randn,
        torch.randn_like,
        torch.randint,
        torch.randint_like,
        torch.randperm,
        torch.normal,
        torch.dropout,
        torch.native_dropout,
        torch.nn.functional.dropout,
        torch.nn.functional.dropout1d,
        torch.nn.functional.dropout2d,
        torch.nn.functional.dropout3d,
        torch.nn.functional.alpha_dropout,
        torch.nn.functional.feature_alpha_dropout,
        torch.nn.functional.gumbel_softmax,
    }
)
_RANDOM_METHODS = frozenset(
    {"bernoulli", "bernoulli_", "uniform_", "normal_", "random_", "exponential_", "geometric_"}
)
_DROPOUTS = frozenset(f for f in _RANDOM_CALLS if "dropout" in f.__name__)


def module_level_draws(gm: fx.GraphModule) -> list[str]:
    """The nodes of a module-level graph that draw random numbers when the model trains: a
    dropout module (or one inside a leaf module) with p > 0 in training mode, a dropout call
    with p > 0 and training on, a random function or method. A stage split at module level
    runs them per micro-batch."""
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            mod = gm.get_submodule(str(node.target))
            if any(
                isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and m.training
                for m in mod.modules()
            ):
                found.append(node.name)
        elif node.op == "call_function" and node.target in _RANDOM_CALLS:
            if node.target in _DROPOUTS:
                p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
                training = node.args[2] if len(node.args) > 2 else node.kwargs.get("training")
                if training is None:  # F.dropout{,1d,2d,3d} default to training, alpha not
                    training = "alpha" not in node.target.__name__
                if p == 0 or training is False:
                    continue
            found.append(node.name)
        elif node.op == "call_method" and node.target in _RANDOM_METHODS:
            found.append(node.name)
    return found


def _shape(node: fx.Node) -> torch.Tensor:
    val = drawn_value(node)
    if not isinstance(val, torch.Tensor):
        raise RuntimeError(f"torch_plugin pipeline: random draw {node.name!r} has no traced shape")
    return val


@dataclasses.dataclass(frozen=True)
class DrawPlan:
    """Per draw of the model, in graph order: whether its dim 0 runs along the batch (read off
    the example's graph at two sizes: dim 0 scales with the samples) and the memory order of
    its dims (bernoulli_ fills in memory order). The same on every rank."""

    batch_major: tuple[bool, ...]
    orders: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(
        whole: fx.Graph, batch: int, other: fx.Graph | None, n: int, free: frozenset[str]
    ) -> DrawPlan:
        nodes = draws_of(whole)
        at_b = [_shape(d) for d in nodes]
        major: list[bool] = []
        if other is not None:
            at_n = [_shape(d) for d in draws_of(other)]
            if len(at_n) != len(at_b):
                raise RuntimeError(
                    f"torch_plugin pipeline: the model draws {len(at_b)} random tensors at "
                    f"{batch} samples but {len(at_n)} at {n}; its dropout cannot be replayed as "
                    "one process draws it"
                )
            for a, o in zip(at_b, at_n, strict=True):
                rows_b = int(a.shape[0]) if a.dim() else 0
                rows_n = int(o.shape[0]) if o.dim() else 0
                major.append(
                    rows_b != rows_n
                    and rows_b % batch == 0
                    and rows_n % n == 0
                    and rows_b // batch == rows_n // n
                )
        else:  # one sample, no other size: a draw over what depends on the batch runs along it
            major = [a.dim() > 0 and d.name not in free for d, a in zip(nodes, at_b, strict=True)]
        orders = tuple(tuple(sorted(range(a.dim()), key=lambda d, a=a: -a.stride(d))) for a in at_b)
        return DrawPlan(tuple(major), orders)

    def check(self, graph: fx.Graph, n: int, where: str) -> None:
        """Raises where `graph` (the model at n samples of a step's shapes) has other draws
        than the plan, or a batch-major draw whose rows do not divide by n."""
        found = draws_of(graph)
        if len(found) != len(self.batch_major):
            raise RuntimeError(
                f"torch_plugin pipeline: the model draws {len(found)} random tensors {where} "
                f"but {len(self.batch_major)} at the example's shapes; its dropout cannot be "
                "replayed as one process draws it"
            )
        for node, major in zip(found, self.batch_major, strict=True):
            val = _shape(node)
            if major and (val.dim() == 0 or val.shape[0] % n):
                raise RuntimeError(
                    f"torch_plugin pipeline: random draw {node.name!r} has {list(val.shape)} "
                    f"{where}, not rows of {n} samples"
                )


class StepDraws:
    """This step's kept draws, by node name (with the rows each sample has, 0 for a draw that
    does not run along the batch), and the rows of the micro-batch a stage is running."""

    def __init__(self) -> None:
        self.kept: dict[str, tuple[torch.Tensor, int]] = {}
        self.rows = (0, 0)

    @contextlib.contextmanager
    def rows_set(self, rows: tuple[int, int]) -> Iterator[None]:
        """Within: `rows` are the micro-batch's (a checkpointed region recomputed in the
        backward draws the masks of the micro-batch it ran for); after: as they were."""
        before, self.rows = self.rows, rows
        try:
            yield
        finally:
            self.rows = before

    def replay(
        self,
        plan: DrawPlan,
        graph: fx.Graph,
        n: int,
        total: int,
        wanted: frozenset[str],
        device: torch.device,
    ) -> None:
        """Draws every replayed node of `graph` (the whole model traced at n samples, checked
        against `plan`) over `total` samples, in graph order; keeps those named in `wanted`."""
        self.kept = {}
        for node, major, order in zip(draws_of(graph), plan.batch_major, plan.orders, strict=True):
            val = _shape(node)
            shape = list(val.shape)
            k = shape[0] // n if major else 0
            if k:
                shape[0] = total * k
            if node.target is _ATEN.rand.default:
                kw = {key: node.kwargs[key] for key in ("dtype", "layout") if key in node.kwargs}
                whole = torch.rand(shape, device=device, **kw)
            elif node.target is _ATEN.native_dropout.default:
                # The fused kernel's mask depends on the shape, layout and generator only: over
                # an empty tensor laid out as the input, it is one process's mask.
                p = node.args[1]
                base = torch.empty_permuted(shape, order, dtype=val.dtype, device=device)
                whole = _ATEN.native_dropout.default(base, p, True)[1]
            else:
                p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
                whole = torch.empty_permuted(shape, order, dtype=val.dtype, device=device)
                whole.bernoulli_(p)
            if node.name in wanted:
                self.kept[node.name] = (whole, k)

    def take(self, name: str) -> torch.Tensor:
        whole, k = self.kept[name]
        lo, hi = self.rows
        return whole[lo * k : hi * k] if k else whole


class _Draw(nn.Module):
    """A stage's draw node: the running micro-batch's rows of the step's replayed draw.
    `kind`: "fill" (bernoulli_ fills the tensor it is given), "new" (rand), or a dropout
    probability (native_dropout: the input times the replayed mask, and the mask)."""

    def __init__(self, draws: StepDraws, name: str, kind: str | float) -> None:
        super().__init__()
        self.draws, self.name, self.kind = draws, name, kind

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        piece = self.draws.take(self.name)
        if self.kind == "fill":
            with torch.no_grad():
                return args[0].copy_(piece)
        if self.kind == "new":
            return piece.clone()
        return apply_dropout_mask(args[0], piece, float(self.kind)), piece


def replace_draws(module: fx.GraphModule, names: dict[fx.Node, str], draws: StepDraws) -> int:
    """Rewrites the stage module's draw nodes (`names`: node to its name in the whole graph)
    into _Draw modules; returns how many. Logs the random ops it leaves to draw per
    micro-batch."""
    count = 0
    for node in list(module.graph.nodes):
        if node.op != "call_function":
            continue
        if node in names:
            attr = f"_draw_{count}"
            kind: str | float = "new"
            if node.target is _ATEN.bernoulli_.float:
                kind = "fill"
            elif node.target is _ATEN.native_dropout.default:
                kind = float(node.args[1])
            module.add_submodule(attr, _Draw(draws, names[node], kind))
            node.op, node.target = "call_module", attr
            node.args, node.kwargs = (() if kind == "new" else node.args[:1]), {}
            count += 1
        elif node.target in _RANDOM:
            log.warning(
                "torch_plugin pipeline: random op %s (node %s) draws per micro-batch: its "
                "values differ from one process's with the same seed",
                node.target,
                node.name,
            )
    if count:
        module.recompile()
    return count


# Flags an op's schema names for its training behaviour (native_dropout's `train`, batch
# norm's `training`, rrelu's `training`) and SDPA's internal dropout.
_MODE_FLAGS = ("train", "training")


def to_evaluation(module: fx.GraphModule, where: str) -> None:
    """Rewrites a stage traced in training mode into what the model computes in eval mode, op
    by op, exactly: a dropout mask (bernoulli_ over an empty tensor, divided by the keep
    probability, multiplied in) keeps every element, so the product is its input; an op's own
    training flag is turned off (native_dropout, batch norm: running statistics, no update);
    SDPA's dropout_p is 0; batch norm's num_batches_tracked is not counted. A draw whose eval
    behaviour cannot be read off the graph (a per-sample rand: stochastic depth; a mask used
    otherwise) raises, naming the node. Other random ops (randn_like: a model's own sampling,
    or noise it adds only when training) run as traced, with a warning naming them."""
    graph = module.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target = node.target
        if target is _ATEN.bernoulli_.float:
            _keep_everything(node, where)
        elif target is _ATEN.rand.default:
            raise RuntimeError(
                f"torch_plugin pipeline: {where} draws per-sample random values (node "
                f"{node.name!r}, rand: stochastic depth) in its training graph; what the model "
                "computes there in eval mode cannot be read off that graph. Evaluate in training "
                "mode (pp.train()) or with the model on one process"
            )
        elif (
            target is _ATEN.add_.Tensor
            and isinstance(node.args[0], fx.Node)
            and node.args[0].op == "get_attr"
            and str(node.args[0].target).endswith("num_batches_tracked")
            and not node.users
        ):
            graph.erase_node(node)
        elif isinstance(target, torch._ops.OpOverload):
            if not _turn_off_training(node, target) and (
                torch.Tag.nondeterministic_seeded in target.tags
            ):
                log.warning(
                    "torch_plugin pipeline: %s in eval mode runs random op %s (node %s) as "
                    "traced for training",
                    where,
                    target,
                    node.name,
                )
    graph.lint()
    module.recompile()


def _turn_off_training(node: fx.Node, target: torch._ops.OpOverload) -> bool:
    """Sets the op's training flags off and its dropout_p to 0; whether it had any. Batch
    norm without running statistics (instance norm, track_running_stats=False) normalises by
    the batch in eval mode too: its flag stays."""
    schema = target._schema.arguments
    values = {
        a.name: (node.args[i] if i < len(node.args) else node.kwargs.get(a.name))
        for i, a in enumerate(schema)
    }
    if "running_mean" in values and values["running_mean"] is None:
        return False
    args, kwargs, found = list(node.args), dict(node.kwargs), False
    for i, arg in enumerate(schema):
        off: bool | float | None = None
        if arg.name in _MODE_FLAGS and str(arg.type) in ("bool", "Optional[bool]"):
            off = False
        elif arg.name == "dropout_p":
            off = 0.0
        if off is None:
            continue
        found = True
        if arg.name in kwargs:
            kwargs[arg.name] = off
        elif i < len(args):
            args[i] = off
        else:  # left to its default (native_dropout's train: None, which trains)
            kwargs[arg.name] = off
    node.args, node.kwargs = tuple(args), kwargs
    return found


def _keep_everything(draw: fx.Node, where: str) -> None:
    """bernoulli_(mask, keep) -> fill_(mask, 1), its division by keep dropped; every other use
    must multiply the mask in (dropout, stochastic depth with bernoulli_), or this raises."""
    mask, keep = draw.args[0], draw.args[1]
    draw.target, draw.args, draw.kwargs = _ATEN.fill_.Scalar, (mask, 1.0), {}
    for user in list(draw.users):
        if user.target in (_ATEN.div_.Scalar, _ATEN.div.Scalar) and user.args[1] == keep:
            user.replace_all_uses_with(draw)
            draw.graph.erase_node(user)
    uses = [u for u in (*draw.users, *mask.users) if u is not draw]
    odd = [u for u in uses if u.target is not _ATEN.mul.Tensor]
    if odd:
        raise RuntimeError(
            f"torch_plugin pipeline: {where} draws a random mask (node {draw.name!r}) that "
            f"{odd[0].name!r} ({odd[0].target}) uses otherwise than dropout does, so what the "
            "model computes there in eval mode cannot be read off its training graph. Evaluate "
            "in training mode (pp.train()) or with the model on one process"
        )


def module_level_evaluation(module: fx.GraphModule, where: str) -> fx.GraphModule:
    """A module-level stage in eval mode: its modules follow the model's mode by themselves
    (they are the model's); a dropout call traced with training on is turned off. Other random
    calls run as traced (logged): torch.fx baked any `if self.training` around them."""
    graph = copy.deepcopy(module.graph)
    for node in graph.nodes:
        if node.op == "call_function" and node.target in _DROPOUTS:
            if len(node.args) > 2:
                node.args = (*node.args[:2], False, *node.args[3:])
            else:
                node.kwargs = {**node.kwargs, "training": False}
        elif (node.op == "call_function" and node.target in _RANDOM_CALLS) or (
            node.op == "call_method" and node.target in _RANDOM_METHODS
        ):
            log.warning(
                "torch_plugin pipeline: %s in eval mode runs random call %s (node %s) as traced "
                "for training",
                where,
                node.target,
                node.name,
            )
    return fx.GraphModule(module, graph)
