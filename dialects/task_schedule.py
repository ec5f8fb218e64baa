"""The task dialect's static schedule: `task.schedule` and its per-SM `task.queue`s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, i32, i64
from xdsl.ir import Block, Region
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    lazy_traits_def,
    prop_def,
    region_def,
    traits_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, NoTerminator
from xdsl.utils.exceptions import VerifyException

from .task_index import GraphIndex
from .task_maps import (
    format_int_list,
    int_value,
    parse_attributes,
    parse_block_region,
    parse_int_list,
)

if TYPE_CHECKING:
    from .task import GraphOp


def _graph_op() -> type[GraphOp]:
    from .task import GraphOp  # task.py imports this module: look GraphOp up lazily

    return GraphOp


@irdl_op_definition
class ScheduleOp(IRDLOperation):
    """Static per-SM queues: each SM runs its queue's tasks in order, once per iteration."""

    name = "task.schedule"

    num_sms = prop_def(IntegerAttr.constr(type=i64))
    body = region_def("single_block")

    traits = lazy_traits_def(lambda: (NoTerminator(), HasParent(_graph_op())))

    def __init__(self, num_sms: int, queues: Sequence[Sequence[int]] | None = None) -> None:
        block = Block()
        for sm, tasks in enumerate(queues or []):
            block.add_op(QueueOp(sm, tasks))
        super().__init__(properties={"num_sms": IntegerAttr(num_sms, i64)}, regions=[Region(block)])

    @property
    def queues(self) -> list[QueueOp]:
        return [op for op in self.body.block.ops if isinstance(op, QueueOp)]

    def verify_(self) -> None:
        if int_value(self.num_sms) < 1:
            raise VerifyException(f"num_sms must be >= 1, got {int_value(self.num_sms)}")
        graph = self.parent_op()
        assert isinstance(graph, _graph_op())  # guaranteed by the HasParent trait
        index = graph.index()
        owner: dict[int, int] = {}
        seen_sms: set[int] = set()
        for op in self.body.block.ops:
            if not isinstance(op, QueueOp):
                raise VerifyException(f"'{op.name}' is not allowed in a task.schedule")
            sm = int_value(op.sm)
            if sm in seen_sms:
                raise VerifyException(f"SM {sm} has two queues")
            seen_sms.add(sm)
            for task in op.task_ids:
                self._claim(index, owner, task, sm)
        tails = index.tail_tasks()
        queued_tail = next((t for t in owner if t in tails), None)
        if queued_tail is not None:
            raise VerifyException(f"{index.describe(queued_tail)} is a tail task and also queued")
        if len(owner) + len(tails) < index.total_tasks:
            missing = next(t for t in range(index.total_tasks) if t not in owner and t not in tails)
            raise VerifyException(
                f"{index.describe(missing)} is in no queue "
                f"({index.total_tasks - len(owner) - len(tails)} of {index.total_tasks} tasks "
                f"unscheduled)"
            )

    @staticmethod
    def _claim(index: GraphIndex, owner: dict[int, int], task: int, sm: int) -> None:
        if not 0 <= task < index.total_tasks:
            raise VerifyException(
                f"task {task} in the queue of SM {sm} is out of range: the graph has "
                f"{index.total_tasks} tasks"
            )
        if task in owner:
            raise VerifyException(
                f"{index.describe(task)} is queued twice (SM {owner[task]} and SM {sm})"
            )
        owner[task] = sm

    def print(self, printer: Printer) -> None:
        printer.print_string(f" num_sms {int_value(self.num_sms)}")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> ScheduleOp:
        parser.parse_keyword("num_sms")
        num_sms = parser.parse_integer(allow_boolean=False)
        attrs = parse_attributes(parser)
        body = parse_block_region(parser)
        op = cls.create(properties={"num_sms": IntegerAttr(num_sms, i64)}, regions=[body])
        op.attributes |= attrs
        return op


@irdl_op_definition
class QueueOp(IRDLOperation):
    """The ordered global task ids one SM runs: `task.queue sm 3 [7, 55, 130]`."""

    name = "task.queue"

    sm = prop_def(IntegerAttr.constr(type=i64))
    tasks = prop_def(DenseArrayBase.constr(i32))

    traits = traits_def(HasParent(ScheduleOp))

    def __init__(self, sm: int, tasks: Sequence[int]) -> None:
        super().__init__(
            properties={
                "sm": IntegerAttr(sm, i64),
                "tasks": DenseArrayBase.from_list(i32, [int(t) for t in tasks]),
            }
        )

    @property
    def task_ids(self) -> tuple[int, ...]:
        return tuple(int(t) for t in self.tasks.get_values())

    def verify_(self) -> None:
        sm = int_value(self.sm)
        schedule = self.parent_op()
        limit = int_value(schedule.num_sms) if isinstance(schedule, ScheduleOp) else None
        if sm < 0 or (limit is not None and sm >= limit):
            raise VerifyException(f"SM {sm} is out of range: the task.schedule has num_sms {limit}")

    def print(self, printer: Printer) -> None:
        printer.print_string(f" sm {int_value(self.sm)} ")
        printer.print_string(format_int_list(self.task_ids))
        printer.print_op_attributes(self.attributes, print_keyword=True)

    @classmethod
    def parse(cls, parser: Parser) -> QueueOp:
        parser.parse_keyword("sm")
        sm = parser.parse_integer(allow_boolean=False)
        op = cls(sm, parse_int_list(parser))
        op.attributes |= parse_attributes(parser)
        return op
