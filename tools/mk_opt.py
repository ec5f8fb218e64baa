"""mk-opt: parse, verify, run passes over and print mk IR, with located errors and exit code 1."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import IO

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from mk import __version__
from mk.diagnostics import (
    LocatingParser,
    MkError,
    error_from_diagnostic,
    error_from_parse,
    verify_located,
)
from mk.dialects import get_all_dialects
from mk.passes import get_all_passes
from mk.pipeline import spec_type_error
from mk.source import is_blank


def _mlir_target() -> type:
    from xdsl.targets.mlir import MLIRTarget

    return MLIRTarget


class MkOptMain(xDSLOptMain):
    """xDSL's opt driver restricted to mk's dialects, passes and targets."""

    def register_all_dialects(self) -> None:
        for name, factory in get_all_dialects().items():
            self.ctx.register_dialect(name, factory)

    def register_all_passes(self) -> None:
        for name, factory in get_all_passes().items():
            self.register_pass(name, factory)

    def register_all_targets(self) -> None:
        self.available_targets["mlir"] = _mlir_target

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        arg_parser.add_argument(
            "--list-passes", action="store_true", help="print the available passes and exit"
        )

    def setup_pipeline(self) -> None:
        def verify_between(_prev: ModulePass | None, module: ModuleOp, _next: ModulePass | None):
            if not self.args.disable_verify:
                verify_located(module)
            if _prev is not None and _next is not None and self.args.print_between_passes:
                print(f"// -----// IR after {_prev.name} //----- //")
                print(module)

        self.pipeline = PassPipeline.parse_spec(
            self.available_passes, self.args.passes, verify_between
        )

    def parse_chunk(
        self, chunk: IO[bytes], file_extension: str, start_offset: int = 0
    ) -> ModuleOp | None:
        text = chunk.read()
        if is_blank(text.decode() if isinstance(text, bytes) else text):
            return ModuleOp([])  # as mlir-opt prints an empty file: an empty module
        parser = LocatingParser(self.ctx, text, self.get_input_name(), start_offset)
        return parser.parse_module(not self.args.no_implicit_module)

    def _process(self, chunk: IO[bytes], offset: int, extension: str) -> str:
        try:
            module = self.parse_chunk(chunk, extension, offset)
        except ParseError as e:
            raise error_from_parse(e, offset) from None
        assert module is not None
        if not self.args.disable_verify:
            verify_located(module)
        try:
            self.apply_passes(module)
            return self.output_resulting_program(module)
        except DiagnosticException as e:
            if isinstance(e, MkError):
                raise
            raise error_from_diagnostic(e) from None

    def run(self) -> None:
        if self.args.list_passes:
            print("\n".join(sorted(self.available_passes)))
            return
        try:
            chunks, extension = self.prepare_input()
        except OSError as e:
            _fail(MkError(f"cannot read input: {e.strerror}: {e.filename}"))
            return
        except ValueError as e:  # an input whose extension no frontend handles
            _fail(MkError(str(e)))
            return
        out = self.prepare_output()
        catching = self.args.verify_diagnostics or self.args.parsing_diagnostics
        try:
            for i, (chunk, offset) in enumerate(chunks):
                if i > 0:
                    out.write("// -----\n")
                try:
                    out.write(self._process(chunk, offset, extension))
                except MkError as e:
                    if not catching:
                        _fail(e)
                    print(e, flush=True)
                finally:
                    chunk.close()
                out.flush()
        finally:
            if out is not sys.stdout:
                out.close()


def _passes_arg(args: Sequence[str] | None) -> str:
    """The -p/--passes spec among the command's arguments ("" without one)."""
    argv = list(sys.argv[1:] if args is None else args)
    for i, a in enumerate(argv):
        if a in ("-p", "--passes") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--passes="):
            return a.split("=", 1)[1]
    return ""


def _fail(e: MkError) -> None:
    sys.stdout.flush()
    print(e, file=sys.stderr)
    sys.exit(1)


def main(args: Sequence[str] | None = None) -> None:
    MkOptMain.version_format = f"mk-opt {__version__} (xdsl {{xdsl_version}})"
    try:
        driver = MkOptMain(
            description="mk-opt: the mk megakernel compiler's pass driver", args=args
        )
    except (ValueError, ArgSpecParseError) as e:  # a bad -p or -t spec
        named = spec_type_error(_passes_arg(args)) if isinstance(e, ValueError) else None
        _fail(MkError(named or str(e)))
        return
    driver.run()


if __name__ == "__main__":
    main()
