"""The task dialect (placeholder until its definition lands)."""

from xdsl.ir import Dialect

Task = Dialect("task", [], [])
