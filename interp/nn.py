"""The nn reference interpreter: runs an nn program on NumPy arrays through xDSL's interpreter."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from xdsl.dialects.builtin import FunctionType
from xdsl.dialects.func import CallOp, FuncOp, ReturnOp
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    impl,
    register_impls,
)
from xdsl.interpreters.func import FuncFunctions
from xdsl.ir import Operation
from xdsl.traits import SymbolTable

from mk.diagnostics import MkError, op_location
from mk.dialects.nn_decode import decode_steps, donated_args, donated_write
from mk.inputs import check_donated, check_inputs, numpy_dtype, random_inputs, tensor_type
from mk.interp.nn_ops import KERNELS, KernelError, current_step
from mk.interp.nn_ties import ArgmaxSteer, argmax_steer
from mk.source import Source, entry_function, load_module

__all__ = ["random_inputs", "run_nn_op", "run_reference"]


def run_nn_op(op: Operation, args: PythonValues) -> np.ndarray:
    """One nn op on NumPy values: compute in f32, round to the result's element type."""
    from mk.dialects.nn import attribute_values

    result_type = tensor_type(op.results[0])
    shape = tuple(result_type.get_shape())
    try:
        out = np.asarray(KERNELS[op.name](args, attribute_values(op), shape))
    except KernelError as e:
        loc = op_location(op)
        raise ValueError(f"{loc + ': ' if loc else ''}error: '{op.name}' {e}") from None
    if out.shape != shape:
        # The verifier should make this impossible; fail loudly rather than return wrong data.
        raise AssertionError(f"'{op.name}' computed shape {out.shape}, its type says {shape}")
    return out.astype(numpy_dtype(result_type.element_type), copy=False)


def _impl_for(op_type: type[Operation]) -> Any:
    @impl(op_type)
    def run(
        _self: InterpreterFunctions, _interp: Interpreter, op: Operation, args: PythonValues
    ) -> PythonValues:
        return (run_nn_op(op, args),)

    return run


@functools.cache
def nn_functions() -> type[InterpreterFunctions]:
    """InterpreterFunctions for every nn op class; dispatch inside goes by op name."""
    from mk.dialects.nn import NN

    methods = {f"run_{cls.__name__}": _impl_for(cls) for cls in NN.operations}
    return register_impls(type("NNFunctions", (InterpreterFunctions,), methods))


def reachable_functions(entry: FuncOp) -> Iterator[FuncOp]:
    """The entry and every function it calls, transitively, each once."""
    seen: set[str] = set()
    stack = [entry]
    while stack:
        func = stack.pop()
        if func.sym_name.data in seen:
            continue
        seen.add(func.sym_name.data)
        yield func
        for op in func.walk():
            if isinstance(op, CallOp):
                callee = SymbolTable.lookup_symbol(op, op.callee)
                if not isinstance(callee, FuncOp) or callee.is_declaration:
                    raise MkError(
                        f"'func.call' calls @{op.callee.string_value()}, which has no body",
                        op_location(op),
                    )
                stack.append(callee)


def _check_supported(entry: FuncOp) -> None:
    """Fail before running, at the op's location, on anything the interpreter cannot run."""
    for func in reachable_functions(entry):
        for op in func.body.walk():
            if not isinstance(op, CallOp | ReturnOp) and op.name not in KERNELS:
                raise MkError(
                    f"'{op.name}' is not supported by the reference interpreter", op_location(op)
                )


def run_interpreted(
    source: Source,
    inputs: Sequence[Any],
    entry: str | None,
    check_supported: Callable[[FuncOp], None],
    extra: Sequence[InterpreterFunctions] = (),
) -> tuple[np.ndarray, ...]:
    """Load, check and run an entry function with the nn implementations plus `extra` ones.

    The one run loop every NumPy interpreter of mk shares: located MkError for a bad program or an
    unsupported op (before anything runs), ValueError for bad inputs, outputs that never alias inputs.
    A decode function (`nn.steps`) runs its body that many times; its donated arguments carry their
    written values from step to step and hold the last ones when it returns.
    """
    module = load_module(source)
    func = entry_function(module, entry)
    arrays = check_inputs(func, tuple(inputs))
    check_supported(func)
    check_donated(func, arrays)
    donated = donated_args(func)
    num_results = len(func.function_type.outputs.data)
    if donated:
        module = module.clone()
        func = entry_function(module, func.sym_name.data)
        return_states(func, donated)
    interp = Interpreter(module)
    interp.register_implementations(FuncFunctions())
    interp.register_implementations(nn_functions()())
    for functions in extra:
        interp.register_implementations(functions)
    state = list(arrays)
    outputs: tuple[Any, ...] = ()
    for step in range(decode_steps(func)):
        token = current_step.set(step)
        # IEEE semantics as on the GPU: overflow to inf and 0/0 to NaN without Python warnings.
        try:
            with np.errstate(all="ignore"):
                outputs = interp.call_op(func, tuple(state))
        finally:
            current_step.reset(token)
        for k, i in enumerate(donated):
            state[i] = outputs[num_results + k]
    for i in donated:
        arrays[i][...] = state[i]
    # Copies, so that no output aliases an input (a returned argument, a reshape's view).
    return tuple(np.array(out, copy=True) for out in outputs[:num_results])


def return_states(func: FuncOp, donated: Sequence[int]) -> None:
    """Append each donated argument's written value to the function's results (interpreters)."""
    ret = func.body.block.last_op
    assert isinstance(ret, ReturnOp)
    values = [*ret.operands, *(donated_write(func, i) for i in donated)]
    ret.detach()
    ret.erase()
    func.body.block.add_op(ReturnOp(*values))
    func.function_type = FunctionType.from_lists(
        func.function_type.inputs.data, [v.type for v in values]
    )


def run_reference(source: Source, *inputs: Any, entry: str | None = None) -> tuple[np.ndarray, ...]:
    """Run the entry function of an nn program on NumPy arrays; returns its outputs.

    Raises MkError for an invalid program and ValueError for inputs whose count, dtype or shape
    do not match the entry's arguments, or data an op rejects (e.g. an embedding id out of range).
    """
    return run_interpreted(source, inputs, entry, _check_supported)


def run_reference_steered(
    source: Source, steer: ArgmaxSteer, *inputs: Any, entry: str | None = None
) -> tuple[np.ndarray, ...]:
    """run_reference with `steer` recording each nn.argmax's near-ties and forcing its choices."""
    token = argmax_steer.set(steer)
    try:
        return run_reference(source, *inputs, entry=entry)
    finally:
        argmax_steer.reset(token)
