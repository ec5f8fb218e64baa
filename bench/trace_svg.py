"""Draw a megakernel timeline (the Chrome trace `prog.trace` writes) as an SVG picture.

One row per SM, one box per task, coloured by the kind of its grid (`k12_l3_q` is a `q`, as in
timeline.py); the legend lists the kinds that take the most SM time. No plotting library needed.
Usage: python bench/trace_svg.py TRACE.json OUT.svg [--iteration N] [--title TEXT]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from html import escape
from pathlib import Path

PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip
OTHER = "#d9d9d9"
ROW, LEFT, TOP, WIDTH = 6, 60, 40, 1200


def kind_of(name: str) -> str:
    """`task 53 (@k12_l3_q[5])` -> `q`."""
    grid = re.search(r"@(\w+)", name)
    return re.sub(r"^k\d+_(l\d+_)?", "", grid.group(1)) if grid else name


def render(events: list[dict[str, object]], title: str) -> str:
    """The SVG text of one iteration's task boxes."""
    if not events:
        raise ValueError("the trace has no task events")
    start = min(float(e["ts"]) for e in events)  # type: ignore[arg-type]
    end = max(float(e["ts"]) + float(e["dur"]) for e in events)  # type: ignore[arg-type]
    sms = 1 + max(int(e["tid"]) for e in events)  # type: ignore[call-overload]
    busy: dict[str, float] = {}
    for e in events:
        k = kind_of(str(e["name"]))
        busy[k] = busy.get(k, 0.0) + float(e["dur"])  # type: ignore[arg-type]
    ranked = sorted(busy, key=lambda k: -busy[k])
    colour = {k: PALETTE[i] for i, k in enumerate(ranked[: len(PALETTE)])}
    scale = WIDTH / max(end - start, 1e-9)
    height = TOP + sms * ROW + 30 + 16 * ((len(colour) + 4) // 5)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{LEFT}" y="16" font-size="13">{escape(title)}</text>',
        f'<text x="4" y="{TOP + 8}">SM 0</text>',
        f'<text x="4" y="{TOP + sms * ROW}">SM {sms - 1}</text>',
    ]
    for e in events:
        x = LEFT + (float(e["ts"]) - start) * scale  # type: ignore[arg-type]
        w = max(float(e["dur"]) * scale, 0.5)  # type: ignore[arg-type]
        y = TOP + int(e["tid"]) * ROW  # type: ignore[call-overload]
        fill = colour.get(kind_of(str(e["name"])), OTHER)
        out.append(
            f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 1}" fill="{fill}">'
            f"<title>{escape(str(e['name']))}: {float(e['dur']):.2f} µs</title></rect>"  # type: ignore[arg-type]
        )
    axis = TOP + sms * ROW + 14
    out.append(f'<text x="{LEFT}" y="{axis}">0 µs</text>')
    out.append(f'<text x="{LEFT + WIDTH - 60}" y="{axis}">{end - start:.1f} µs</text>')
    for i, k in enumerate([*colour, "other"]):
        x, y = LEFT + (i % 5) * 230, axis + 16 + 16 * (i // 5)
        fill = colour.get(k, OTHER)
        share = f" {busy[k] / sum(busy.values()):.0%}" if k in busy else ""
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{fill}"/>')
        out.append(f'<text x="{x + 14}" y="{y}">{escape(k)}{share}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trace", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--iteration", type=int, default=-1, help="which decode step (last)")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    events = json.loads(args.trace.read_text())["traceEvents"]
    steps = sorted({int(e["args"]["iteration"]) for e in events})
    chosen = steps[args.iteration]
    picked = [e for e in events if int(e["args"]["iteration"]) == chosen]
    title = args.title or f"{args.trace.stem}: step {chosen}, {len(picked)} tasks"
    args.out.write_text(render(picked, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
