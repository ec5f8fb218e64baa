"""The nn dialect (placeholder until its definition lands)."""

from xdsl.ir import Dialect

NN = Dialect("nn", [], [])
