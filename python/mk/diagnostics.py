"""Located, user-facing errors: parsing that records op locations and a verifier that names them."""

from __future__ import annotations

import sys
from collections.abc import Callable

from xdsl.context import Context
from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr
from xdsl.dialects.func import FuncOp
from xdsl.ir import Operation, OpResult
from xdsl.parser import Parser
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.utils.lexer import Span


class MkError(DiagnosticException):
    """An error in user input. `str()` is `file:line:col: error: message`, then the source line."""

    def __init__(self, message: str, location: str | None = None, context: str = "") -> None:
        self.message = message
        self.location = location
        self.context = context
        super().__init__(self.render())

    def render(self) -> str:
        head = (
            f"{self.location}: error: {self.message}" if self.location else f"error: {self.message}"
        )
        return head + ("\n" + self.context if self.context else "")


def _caret_context(span: Span[str] | Span[bytes]) -> str:
    """The source line of a span with a caret under its start (clang style)."""
    text = span.input.content
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    start = span.start
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    line = text[line_start : None if line_end < 0 else line_end]
    return f"{line}\n{' ' * (start - line_start)}^"


def error_from_parse(e: ParseError, line_offset: int = 0) -> MkError:
    loc = e.span.get_location()
    return MkError(e.msg, f"{loc.file}:{loc.line + line_offset}:{loc.col}", _caret_context(e.span))


class LocatingParser(Parser):
    """A parser that gives every op a `file:line:col` location and locates attribute errors.

    xDSL leaves ops without locations and raises attribute verify errors with none; a compiler's
    user needs both to find the mistake in their file.
    """

    def __init__(self, ctx: Context, text: str | bytes, name: str, line_offset: int = 0) -> None:
        super().__init__(ctx, text, name)
        self._line_offset = line_offset
        self._op_names: list[str] = []  # ops being parsed, outermost first

    def _get_op_by_name(self, name: str) -> type[Operation]:
        self._op_names.append(name)
        return super()._get_op_by_name(name)

    def parse_operation(self) -> Operation:
        span = self._current_token.span
        depth = len(self._op_names)
        try:
            op = super().parse_operation()
        except VerifyException as e:
            name = self._op_names[depth] if len(self._op_names) > depth else None
            prefix = f"'{name}' " if name else ""
            self.raise_error(prefix + _message(e), span.start, span.end)
        finally:
            del self._op_names[depth:]
        if isinstance(op.location, FileLineColLoc):
            return op
        loc = span.get_location()
        op.location = FileLineColLoc(
            StringAttr(loc.file), IntAttr(loc.line + self._line_offset), IntAttr(loc.col)
        )
        return op


def op_location(op: Operation) -> str | None:
    """`file:line:col` of an op, or of its nearest located ancestor."""
    node: Operation | None = op
    while node is not None:
        if isinstance(node.location, FileLineColLoc):
            loc = node.location
            return f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
        node = node.parent_op()
    return None


_VERIFY_PREFIX = "Operation does not verify: "


def _message(e: Exception) -> str:
    """The exception's message on one line, without xDSL's generic prefix (the IR is in notes)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return " ".join(lines).removeprefix(_VERIFY_PREFIX) or type(e).__name__


def verify_located(module: ModuleOp) -> None:
    """Verify every op in source order, raising MkError at the first failing op's location.

    A function also gets the decode-loop rules of the nn dialect (`nn.steps`, `{nn.donated}`),
    and its body the rule that a value is defined before it is used.
    """
    from mk.dialects.nn_decode import verify_decode_function

    for op in module.walk():
        try:
            op.verify(verify_nested_ops=False)
        except VerifyException as e:
            message = _message(e)
            if not message.startswith(f"'{op.name}'"):  # xDSL's trait messages name the op already
                message = f"'{op.name}' {message}"
            raise MkError(message, op_location(op)) from None
        if (early := _use_before_definition(op)) is not None:
            raise MkError(f"'{op.name}' {early}", op_location(op))
        if isinstance(op, FuncOp) and not op.is_declaration:
            try:
                verify_decode_function(op)
            except VerifyException as e:
                message = f"'func.func' @{op.sym_name.data}: {_message(e)}"
                raise MkError(message, op_location(op)) from None


def _use_before_definition(op: Operation) -> str | None:
    """What is wrong when an operand of `op` comes from an op of a function body that is not
    before it (the parser resolves a name used before its definition to the later value), else
    None. (xDSL's dominance orders blocks, not the ops of one block.)"""
    for i, value in enumerate(op.operands):
        if not isinstance(value, OpResult):
            continue
        block = value.op.parent_block()
        if block is None or not isinstance(block.parent_op(), FuncOp):
            continue
        user: Operation | None = op  # op, or the op of its function's body that holds it
        while user is not None and user.parent_block() is not block:
            user = user.parent_op()
        if user is not None and not value.op.is_before_in_block(user):
            name = f"%{value.name_hint}" if value.name_hint else "its value"
            return f"operand #{i} ({name}) is used before its definition"
    return None


def error_from_diagnostic(e: DiagnosticException, module: ModuleOp | None = None) -> MkError:
    """A pass or target failure; located when the exception names an op."""
    op = getattr(e, "op", None)
    loc = op_location(op) if isinstance(op, Operation) else None
    return MkError(_message(e), loc)


def parse_module(ctx: Context, text: str | bytes, name: str, line_offset: int = 0) -> ModuleOp:
    """Parse MLIR text into a module, raising MkError with the location of any syntax error."""
    try:
        return LocatingParser(ctx, text, name, line_offset).parse_module()
    except ParseError as e:
        raise error_from_parse(e) from None


def run_tool(prog: str, body: Callable[[], int], extra: tuple[type[Exception], ...] = ()) -> int:
    """Run a command-line tool's body: user errors (MkError, ValueError, RuntimeError and
    `extra`) print `prog: error: ...` (or the located message as it is) and give exit status 1,
    never a traceback."""
    try:
        code = body()
    except (MkError, ValueError, RuntimeError, *extra) as e:
        sys.stdout.flush()
        message = str(e)
        print(message if "error:" in message else f"{prog}: error: {message}", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    return code
