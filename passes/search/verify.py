"""Probabilistic equivalence of a candidate μGraph and its nn target, then a float check.

**Finite-field trials.** A trial runs both programs (`field`) over Z_p × Z_q for the two primes
p, q of `field.PRIMES` (both just below 2^31), on inputs drawn uniformly and independently in
each residue and with a fresh key for every uninterpreted function; a function sees both
residues of its argument. Different outputs prove the candidate wrong. If the two programs are
*not* the same formal expression (commutative-ring identities, with the uninterpreted functions
compared by their arguments), the chance that one trial still sees equal outputs is at most

    δ = (D/p)·(D/q) · (1 + Σ_f C(N_f, 2))

where D bounds the degree of every value of either program (function outputs counted as fresh
variables) and N_f bounds the number of formally distinct applications of function f in the two
programs (scalar applications counted; a block recomputing what another block with the same
input slices made is not counted again). The argument: either two applications with formally
different arguments collide — the difference of the arguments is a nonzero polynomial of degree
<= D that must vanish at independent uniform points mod p and mod q, at most (D/p)·(D/q) per
pair (Schwartz–Zippel) — or none does, the function outputs are independent uniform values, and
the difference of the outputs is a nonzero polynomial of degree <= D, vanishing mod both primes
with probability at most (D/p)·(D/q). Trials draw afresh, so their bounds multiply; they repeat
until the product is below 2^-bits (30 by default). A program so large that δ >= 1 is not
certified (the rules' lowering stays). The keyed hash (splitmix64) stands in for a random
function: the bound assumes it is one.

**Float check.** The candidate then runs through the mugraph interpreter and the target through
the nn reference interpreter on random float inputs; every output must be within DESIGN.md's
tolerance (1e-5 relative L2 for f32, 2e-2 for 16-bit floats). Inputs on which the reference
itself is not finite (an RMSNorm epsilon drawn below -mean(x²)) are outside the function's
domain: fresh ones are drawn, up to FLOAT_DRAWS times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.dialects.func import FuncOp
from xdsl.ir import SSAValue

from mk.diagnostics import MkError
from mk.inputs import random_inputs
from mk.passes.search.field import Field, Unsupported, run_function

MAX_TRIALS = 16
FLOAT_DRAWS = 8  # input draws the float check tries for one on which the reference is finite


@dataclass
class Verdict:
    """The outcome of verifying one candidate."""

    equivalent: bool
    reason: str
    trials: int = 0
    log2_bound: float = 0.0  # log2 of the false-positive bound reached (<= -bits when accepted)
    trial_log2: list[float] = field(default_factory=list)  # each trial's log2(δ_p1 · δ_p2)
    float_errors: list[float] = field(default_factory=list)


def _shape(value: SSAValue) -> tuple[int, ...]:
    assert isinstance(value.type, TensorType)
    return tuple(value.type.get_shape())


def _log2_delta(f: Field) -> float:
    pairs = sum(n * (n - 1) // 2 for n in f.uses.values())
    bound = 2 * math.log2(f.max_deg) + math.log2(1 + pairs) - sum(map(math.log2, f.primes))
    return min(0.0, bound)


def field_trials(target: FuncOp, candidate: FuncOp, seed: int, bits: int = 30) -> Verdict:
    """Finite-field trials until the false-positive bound is below 2^-bits."""
    total, logs = 0.0, []
    for trial in range(MAX_TRIALS):
        f = Field(np.random.default_rng([seed, trial]))
        inputs = [f.random(_shape(a)) for a in target.body.block.args]
        try:
            want = run_function(f, target, inputs)
            got = run_function(f, candidate, inputs)
        except Unsupported as e:
            return Verdict(False, f"not modelled over finite fields: {e}", trial)
        except AssertionError as e:
            return Verdict(False, f"malformed candidate: {e}", trial)
        for k, (w, g) in enumerate(zip(want, got, strict=True)):
            if w.a.shape != g.a.shape or not np.array_equal(w.a, g.a):
                return Verdict(False, f"output #{k} differs mod p·q (trial {trial})", trial + 1)
        logs.append(_log2_delta(f))
        total += logs[-1]
        if total < -bits:
            return Verdict(True, "equal in every trial", trial + 1, total, logs)
        if logs[-1] == 0.0:
            break  # a trial this large bounds nothing; more of the same will not either
    return Verdict(
        False, f"bound 2^{total:.1f} after {len(logs)} trial(s): too large to certify",
        len(logs), total, logs,
    )  # fmt: skip


def float_check(target: ModuleOp, candidate: ModuleOp, entry: str, seed: int) -> list[float] | None:
    """Relative errors of the candidate (mugraph interpreter) against the reference, or None
    when an output is outside the tolerance."""
    from mk.compiler import output_error
    from mk.interp.mugraph import run_mugraph
    from mk.interp.nn import run_reference
    from mk.source import entry_function

    func = entry_function(target, entry)
    for draw in range(FLOAT_DRAWS):
        inputs = random_inputs(func, seed + draw)
        want = run_reference(target, *inputs, entry=entry)
        if all(np.isfinite(np.asarray(w, dtype=np.float64)).all() for w in want):
            break
    else:
        return None
    try:
        got = run_mugraph(candidate, *inputs, entry=entry)
    except MkError:
        return None
    errors = []
    for w, g in zip(want, got, strict=True):
        err, tol = output_error(g, w)
        if not err <= tol:
            return None
        errors.append(err)
    return errors


def verify(target: ModuleOp, candidate: ModuleOp, entry: str, seed: int, bits: int = 30) -> Verdict:
    """Field trials, then the float check; `target` and `candidate` hold function @entry."""
    from mk.source import entry_function

    verdict = field_trials(
        entry_function(target, entry), entry_function(candidate, entry), seed, bits
    )
    if not verdict.equivalent:
        return verdict
    errors = float_check(target, candidate, entry, seed)
    if errors is None:
        verdict.equivalent, verdict.reason = False, "float check failed"
        return verdict
    verdict.float_errors = errors
    return verdict
