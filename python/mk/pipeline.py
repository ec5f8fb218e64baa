"""The pass pipeline: its stages from nn to task, and the routing and checking of the pass
options mk.compile and the tools take."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline

# The pipeline, one stage per IR level: (stage, passes run to reach it). Options are routed
# to every pass of a stage that declares them (num_sms reaches nn-to-mugraph and the scheduler).
MUGRAPH_PASSES = (
    "nn-to-mugraph", "mugraph-append-writes", "mugraph-fuse-loop", "mugraph-fuse-accumulate",
    "mugraph-split-loop", "mugraph-fuse-epilogue",
)  # fmt: skip
PIPELINE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nn", ()),  # parse + verify
    ("mugraph", MUGRAPH_PASSES),
    ("task", ("mugraph-to-task", "task-tails", "task-schedule")),
)
STAGES = tuple(name for name, _ in PIPELINE)
# mk.compile(..., search=True): the superoptimizer replaces what it can beat, the rules the rest.
SEARCH_PIPELINE = tuple(
    (stage, ("superoptimize", *names) if stage == "mugraph" else names) for stage, names in PIPELINE
)


def _pass_fields(name: str) -> dict[str, dataclasses.Field[Any]]:
    from mk.passes import get_all_passes

    return {f.name: f for f in dataclasses.fields(get_all_passes()[name]())}


def _option_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _typed(field: dataclasses.Field[Any], value: Any) -> Any:
    """A switch given as 0 or 1 (a tool's --option flag_values=1) as the bool it means, and a
    whole number given for a float option (bandwidth_gbs=4100) as that float."""
    if field.type in (bool, "bool") and type(value) is int and value in (0, 1):
        return bool(value)
    if field.type in (float, "float") and type(value) is int:
        return float(value)
    return value


def pass_spec(names: Sequence[str], options: Mapping[str, Any]) -> str:
    """`a{x=1 y=2},b{...}`: each pass with the options among its fields (spelled with dashes)."""
    specs = []
    for name in names:
        fields = _pass_fields(name)
        given = [
            f"{key.replace('_', '-')}={_option_text(_typed(fields[key], value))}"
            for key, value in sorted(options.items())
            if key in fields
        ]
        specs.append(f"{name}{{{' '.join(given)}}}" if given else name)
    return ",".join(specs)


_KINDS = {"int": (int, "an int"), "float": (float, "a float"), "bool": (bool, "a bool")}


def check_options(options: Mapping[str, Any], pipeline: Sequence[Any] = PIPELINE) -> None:
    """TypeError naming an unknown pass option, or one whose value is not of its pass's type."""
    fields = {f: d for _, names in pipeline for n in names for f, d in _pass_fields(n).items()}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise TypeError(
            f"mk.compile: unknown pass option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(fields))}"
        )
    for name, value in options.items():
        kind, typed = str(fields[name].type), _typed(fields[name], value)
        if kind in _KINDS and (type(typed) is not _KINDS[kind][0]):
            raise TypeError(
                f"mk.compile: pass option {name} must be {_KINDS[kind][1]}, got {value!r}"
            )


def spec_type_error(spec: str) -> str | None:
    """The first option of a pass pipeline spec (`-p`) whose value is not of its pass's type,
    named (xDSL's own message names neither the pass nor the option; it takes no whole number for
    a float or 0/1 for a bool either); None if there is none."""
    from xdsl.utils.arg_spec import parse_pipeline

    from mk.passes import get_all_passes

    passes = get_all_passes()
    for arg in parse_pipeline(spec):
        if arg.name not in passes:
            continue
        fields = {f.name: f for f in dataclasses.fields(passes[arg.name]())}
        for key, values in arg.parameters.items():
            field = fields.get(key.replace("-", "_"))
            kind = str(field.type) if field is not None else ""
            if kind in _KINDS and len(values) == 1 and type(values[0]) is not _KINDS[kind][0]:
                hint = (
                    f" (write {values[0]}.0)" if kind == "float" and type(values[0]) is int else ""
                )
                return f"pass {arg.name}: option {key} must be {_KINDS[kind][1]}, got {values[0]!r}{hint}"
    return None


def parse_pass_options(items: Sequence[str]) -> dict[str, int | str]:
    """`NAME=VALUE` items (a tool's --option, a benchmark's MK_PASS_OPTIONS) as mk.compile
    keywords: whole numbers become ints. ValueError names a malformed item or unknown option."""
    options: dict[str, int | str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier() or not value:
            raise ValueError(f"pass option {item!r}: expected NAME=VALUE, e.g. kv_splits=4")
        options[name] = int(value) if value.lstrip("-").isdigit() else value
    try:
        check_options(options)
    except TypeError as e:  # text from a user: a value error, not a programming one
        raise ValueError(str(e)) from None
    return options


class StageTexts(Mapping[str, str]):
    """Each stage's IR text, printed when first read: a whole model's mugraph and task IR take
    about half a second to print, which a CUDA compile (keyed by its emitted source) never
    needs. A stage that later passes rewrite is kept as a clone; the last one as it is."""

    def __init__(self) -> None:
        self._ops: dict[str, ModuleOp] = {}
        self._texts: dict[str, str] = {}

    def keep(self, stage: str, module: ModuleOp) -> None:
        self._ops[stage] = module
        self._texts.pop(stage, None)

    def __getitem__(self, stage: str) -> str:
        if stage not in self._texts:
            self._texts[stage] = str(self._ops[stage])
        return self._texts[stage]

    def __iter__(self) -> Iterator[str]:
        return iter(self._ops)

    def __len__(self) -> int:
        return len(self._ops)


def run_pipeline(
    module: ModuleOp, options: Mapping[str, Any], pipeline: Sequence[Any] = PIPELINE
) -> StageTexts:
    """Lowers `module` in place through every stage; returns each stage's IR text."""
    from mk.dialects import make_context
    from mk.passes import get_all_passes

    texts = StageTexts()
    for i, (stage, names) in enumerate(pipeline):
        if names:
            spec = pass_spec(names, options)
            PassPipeline.parse_spec(get_all_passes(), spec).apply(make_context(), module)
            module.verify()
        texts.keep(stage, module if i == len(pipeline) - 1 else module.clone())
    return texts
