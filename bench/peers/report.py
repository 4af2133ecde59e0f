"""Render a `python -m bench.peers --out FILE` result as the Markdown table of bench/RESULTS.md.

.venv/bin/python -m bench.peers.report /tmp/peers.json > /tmp/table.md  # machine JSON on stderr
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .run import (
    CONFIGS,
    METRICS,
    PAIRS,
    WORKLOADS,
    _fmt,
    _ratio,
    cpu_per_msg_us,
    cpu_reference_line,
    metric,
    targets,
)


def render(data: dict[str, Any]) -> str:
    runs: dict[str, list[dict[str, Any]]] = data["runs"]
    configs = [c for c in CONFIGS if c in runs]
    pairs = [p for p in PAIRS if p[0] in runs and p[1] in runs]
    head = ["metric", *configs, *(f"{a.split('-')[1]}/{b}" for a, b in pairs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, w, path, _higher in METRICS:
        vals = {c: metric(runs[c], w, path) for c in configs}
        row = [label, *(_fmt(vals[c]) for c in configs)]
        row += [_ratio(vals[a], vals[b]) for a, b in pairs]
        lines.append("| " + " | ".join(row) + " |")
    for w in WORKLOADS:
        for key, name in (("server_cpu_s", "server"), ("client_cpu_s", "client")):
            vals = {c: cpu_per_msg_us(runs[c], w, key) for c in configs}
            row = [f"{w} {name} CPU us/msg", *(_fmt(vals[c]) for c in configs)]
            row += [_ratio(vals[a], vals[b]) for a, b in pairs]
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(cpu_reference_line(data.get("machine", {})))
    lines.append("")
    lines.append("| target | result | figures |")
    lines.append("|---|---|---|")
    for desc, ok, figures in targets(runs):
        mark = "not measured" if ok is None else ("met" if ok else "missed")
        lines.append(f"| {desc} | {mark} | {figures} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("result", type=Path)
    opts = ap.parse_args()
    data = json.loads(opts.result.read_text())
    # The machine and disk figures go to stderr: stdout is the Markdown alone.
    print(json.dumps({"machine": data["machine"], "disk": data["disk"]}, indent=1), file=sys.stderr)
    print(render(data))


if __name__ == "__main__":
    main()
