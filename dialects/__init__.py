"""The dialects of mk (nn, mugraph, task) and the context that loads them with builtin/func/arith/math."""

from collections.abc import Callable

from xdsl.context import Context
from xdsl.ir import Dialect


def _nn() -> Dialect:
    from mk.dialects.nn import NN

    return NN


def _mugraph() -> Dialect:
    from mk.dialects.mugraph import MuGraph

    return MuGraph


def _task() -> Dialect:
    from mk.dialects.task import Task

    return Task


def _builtin() -> Dialect:
    from xdsl.dialects.builtin import Builtin

    return Builtin


def _func() -> Dialect:
    from xdsl.dialects.func import Func

    return Func


def _arith() -> Dialect:
    from xdsl.dialects.arith import Arith

    return Arith


def _math() -> Dialect:
    from xdsl.dialects.math import Math

    return Math


def get_all_dialects() -> dict[str, Callable[[], Dialect]]:
    """Name -> lazy factory of every dialect mk-opt and mk.compile understand."""
    return {
        "nn": _nn,
        "mugraph": _mugraph,
        "task": _task,
        "builtin": _builtin,
        "func": _func,
        "arith": _arith,
        "math": _math,
    }


def make_context() -> Context:
    """A fresh xDSL context with every mk dialect registered (loaded lazily)."""
    ctx = Context()
    for name, factory in get_all_dialects().items():
        ctx.register_dialect(name, factory)
    return ctx
