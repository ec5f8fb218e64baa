"""Mutated examples: a program with one type, attribute or operand changed compiles, or fails with
a located MkError, never another exception (what a user's typo must get)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

import mk
from mk.diagnostics import MkError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.mlir"))
ATTRIBUTE = re.compile(
    r"(dim|epsilon|scale|factor|offsets|sizes|perm|causal|keepdim|offset) = ([^,}]+)"
)
VALUES = [
    "-7 : i64",
    "9 : i64",
    "0 : i64",
    "array<i64: 0>",
    "array<i64: 5, 0, 0>",
    "true",
    "-1.0 : f32",
]


def retype(rng: random.Random, text: str) -> str:
    """One tensor type changed wherever it appears: a dim, the rank or the element type."""
    old = rng.choice(sorted(set(re.findall(r"tensor<[^>]*>", text))))
    dims = old[len("tensor<") : -1].split("x")
    kind = rng.randrange(3) if len(dims) > 1 else 2
    if kind == 0:
        i = rng.randrange(len(dims) - 1)
        dims[i] = str(rng.choice([1, 3, int(dims[i]) + 1, 2 * int(dims[i])]))
    elif kind == 1:
        dims.pop(rng.randrange(len(dims) - 1))
    else:
        dims[-1] = rng.choice(["f32", "bf16", "f16", "i32"])
    return text.replace(old, "tensor<" + "x".join(dims) + ">")


def reattribute(rng: random.Random, text: str) -> str:
    found = list(ATTRIBUTE.finditer(text))
    if not found:
        return retype(rng, text)
    m = rng.choice(found)
    return text[: m.start(2)] + rng.choice(VALUES) + text[m.end(2) :]


def swap_operand(rng: random.Random, text: str) -> str:
    """One use of a value replaced by another value of the function, defined anywhere."""
    values = sorted(set(re.findall(r"%\w+", text)))
    uses = list(re.finditer(r"(?<=[ (,])%\w+(?=[,) :])", text))
    m = rng.choice(uses)
    return text[: m.start()] + rng.choice(values) + text[m.end() :]


def mutant(seed: int) -> tuple[str, str]:
    rng = random.Random(seed)
    path = rng.choice(EXAMPLES)
    change = rng.choice([retype, reattribute, swap_operand])
    return f"{path.stem} {change.__name__}", change(rng, path.read_text())


def outcome(text: str) -> str:
    """`compiled`, or the first line of the located MkError (any other exception propagates)."""
    try:
        mk.compile(text, target="cuda")  # every pass and the emitter, without a build
    except MkError as e:
        return str(e).splitlines()[0]
    return "compiled"


@pytest.mark.usefixtures("no_nvcc")
@pytest.mark.parametrize("seed", range(40))
def test_a_mutated_example_compiles_or_is_a_located_error(seed: int) -> None:
    label, text = mutant(seed)
    result = outcome(text)
    assert result == "compiled" or re.match(r"<source>:\d+:\d+: error: ", result), (label, result)


@pytest.mark.usefixtures("no_nvcc")
def test_the_mutants_reach_the_verifier_and_the_passes() -> None:
    """Some mutants compile and some fail in an op's verifier, not all in the parser."""
    results = [outcome(mutant(seed)[1]) for seed in range(40)]
    compiled = results.count("compiled")
    verified = sum(": error: '" in r for r in results)  # an op's verifier names the op
    assert compiled >= 3 and verified >= 5, (compiled, verified)
