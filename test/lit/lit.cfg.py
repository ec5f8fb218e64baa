"""lit configuration: mk-opt and filecheck from the Python environment running lit."""

import os
import sys

import lit.formats

config.name = "mk"  # noqa: F821
config.test_format = lit.formats.ShTest(execute_external=False)  # noqa: F821
config.suffixes = [".mlir"]  # noqa: F821
config.excludes = ["Inputs"]  # noqa: F821
config.test_source_root = os.path.dirname(__file__)  # noqa: F821
config.test_exec_root = os.path.join(os.path.dirname(__file__), "Output")  # noqa: F821

# lit scrubs the environment; find the tools next to the interpreter that runs lit.
config.environment["PATH"] = os.pathsep.join(  # noqa: F821
    [os.path.dirname(sys.executable), config.environment.get("PATH", "")]  # noqa: F821
)
config.substitutions.append(  # noqa: F821
    (
        "MK_ROUNDTRIP",
        "mk-opt %s --split-input-file | mk-opt --split-input-file | filecheck %s",
    )
)
config.substitutions.append(  # noqa: F821
    (
        "MK_GENERIC_ROUNDTRIP",
        "mk-opt %s --split-input-file --print-op-generic | mk-opt --split-input-file | filecheck %s",
    )
)
