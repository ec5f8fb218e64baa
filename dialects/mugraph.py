"""The mugraph dialect (placeholder until its definition lands)."""

from xdsl.ir import Dialect

MuGraph = Dialect("mugraph", [], [])
