"""The nn subgraphs the search works on: the whole function when it is small and fully modelled,
else single-output cones of runs of consecutive modelled ops. Each is extracted as a function
of its own (the values it reads from outside are the arguments) and its kernels are spliced
back in place of the ops."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from xdsl.dialects.builtin import FunctionType
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Block, Operation, Region, SSAValue

from mk.dialects.mugraph_base import shape_of
from mk.passes.search.target import SUPPORTED


@dataclass
class Subgraph:
    ops: list[Operation]
    inputs: list[SSAValue]
    outputs: list[SSAValue]

    @classmethod
    def of(cls, ops: list[Operation], outputs: list[SSAValue]) -> Subgraph:
        """The subgraph of `ops` (in program order): its inputs are the values they read and
        do not produce, in order of first use."""
        produced = {r for op in ops for r in op.results}
        inputs = list(dict.fromkeys(v for op in ops for v in op.operands if v not in produced))
        return cls(ops, inputs, outputs)

    def extract(self, name: str) -> FuncOp:
        """A function computing the outputs from the inputs with clones of the ops."""
        block = Block(arg_types=[v.type for v in self.inputs])
        mapping: dict[SSAValue, SSAValue] = {}
        for arg, v in zip(block.args, self.inputs, strict=True):
            arg.name_hint = v.name_hint
            mapping[v] = arg
        for op in self.ops:
            block.add_op(op.clone(value_mapper=mapping))
        block.add_op(ReturnOp(*(mapping[v] for v in self.outputs)))
        ftype = FunctionType.from_lists(
            [v.type for v in self.inputs], [v.type for v in self.outputs]
        )
        return FuncOp(name, ftype, Region(block))

    def replace(self, kernels: FuncOp) -> list[Operation]:
        """Put the body of `kernels` (a function like `extract`'s) before the last op and
        erase the ops no one uses any more (a recomputed op another cone reads stays)."""
        first = self.ops[-1]
        block = first.parent_block()
        assert block is not None
        mapping: dict[SSAValue, SSAValue] = dict(
            zip(kernels.body.block.args, self.inputs, strict=True)
        )
        added: list[Operation] = []
        for op in kernels.body.block.ops:
            if isinstance(op, ReturnOp):
                for old, new in zip(self.outputs, op.operands, strict=True):
                    mapping[new].name_hint = old.name_hint
                    old.replace_all_uses_with(mapping[new])
                break
            clone = op.clone(value_mapper=mapping)
            block.insert_op_before(clone, first)
            added.append(clone)
        for op in reversed(self.ops):
            if op.parent is block and not any(r.uses for r in op.results):
                block.erase_op(op)
        return added


def _modelled(op: Operation) -> bool:
    return isinstance(op, SUPPORTED) and all(shape_of(v) for v in (*op.operands, *op.results))


def _runs(func: FuncOp) -> list[list[Operation]]:
    runs: list[list[Operation]] = [[]]
    for op in func.body.block.ops:
        if _modelled(op):
            runs[-1].append(op)
        elif runs[-1] and op.dialect_name() != "mugraph":  # a kernel spliced in keeps the run
            runs.append([])
    return [run for run in runs if run]


def _roots(run: list[Operation]) -> list[SSAValue]:
    """Values a cone is searched for: used outside the run (or returned), or by two ops of it."""
    inside = set(run)
    out = []
    for op in run:
        for r in op.results:
            users = {u.operation for u in r.uses}
            if users - inside or len(users) > 1:
                out.append(r)
    return out


def _cone(root: SSAValue, run: list[Operation], roots: set[SSAValue], max_ops: int) -> Subgraph:
    """The ops of `run` computing `root`, back to other roots (recomputed when they are made by
    one cheap op from values outside the run or roots, as an RMSNorm feeding several linears),
    at most `max_ops` of them (nearest first; what is left over becomes an input)."""
    members = set(run)
    chosen: list[Operation] = []
    frontier = [root]
    while frontier and len(chosen) < max_ops:
        v = frontier.pop(0)
        op = v.owner
        if not isinstance(op, Operation) or op not in members or op in chosen:
            continue
        if v is not root and v in roots and not _cheap(op, members, roots):
            continue
        chosen.append(op)
        frontier.extend(op.operands)
    return Subgraph.of([op for op in run if op in chosen], [root])


def _cheap(op: Operation, members: set[Operation], roots: set[SSAValue]) -> bool:
    from mk.dialects import nn

    if isinstance(op, nn.LinearOp | nn.MatmulOp):
        return False
    return all(v.owner not in members or v in roots for v in op.operands)


def _whole(func: FuncOp, max_ops: int) -> Subgraph | None:
    runs = _runs(func)
    body = [op for op in func.body.block.ops if not isinstance(op, ReturnOp)]
    if len(runs) != 1 or len(runs[0]) != len(body) or len(body) > max_ops:
        return None
    run = runs[0]
    outputs = [r for r in _roots(run) if any(u.operation not in set(run) for u in r.uses)]
    return Subgraph.of(run, outputs)


def subgraphs(func: FuncOp, max_ops: int) -> Iterator[Subgraph]:
    """The whole function when every op is modelled and there are at most `max_ops`; else one
    single-output cone per root of each run of consecutive modelled ops, in program order. A
    root made cheaply (see `_cone`) and used only inside its run is not searched on its own.
    Lazily: each cone is cut from the function as it is after the previous one was replaced."""
    whole = _whole(func, max_ops)
    if whole is not None:
        yield whole
        return
    planned = [r for run in _runs(func) for r in _searched_roots(run)]
    for root in planned:
        op = root.owner
        if not isinstance(op, Operation) or op.parent is None or not root.uses:
            continue  # replaced by an earlier cone's kernel, or dead now
        run = next(run for run in _runs(func) if op in run)
        yield _cone(root, run, set(_roots(run)), max_ops)


def _searched_roots(run: list[Operation]) -> list[SSAValue]:
    inside, roots = set(run), _roots(run)
    out = []
    for r in roots:
        op = r.owner
        outside = any(u.operation not in inside for u in r.uses)
        if outside or not (isinstance(op, Operation) and _cheap(op, inside, set(roots))):
            out.append(r)
    return out
