"""Command-line tools: mk-opt (pass driver), mk-run (compile and run) and mk-generate (decode)."""

from __future__ import annotations

import argparse


def add_option_flag(parser: argparse.ArgumentParser) -> None:
    """--option NAME=VALUE, repeatable: pass options for mk.compile (mk.pipeline.parse_pass_options
    reads them)."""
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a pass option for mk.compile, e.g. kv_splits=4 (repeatable)",
    )
