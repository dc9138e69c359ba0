#!/usr/bin/env python3
"""Regenerate the README's sample of `presched bench` from the command itself (no hand-copied
numbers): runs `python -m presched.cli bench` with no arguments, puts its printed table (all but
the final `wrote ...` line, which holds the wall time) between README.md's `bench-sample`
markers, the loads 0.9 and 0.95 as a markdown table between docs/bench.md's markers, and copies
its plot to docs/bench-default.png.

    python scripts/readme_sample.py           # rewrite README.md, docs/bench.md, the plot
    python scripts/readme_sample.py --check   # exit 1 if README.md's sample is not the output

tests/test_readme.py checks the same equality.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench-sample:begin -->", "<!-- bench-sample:end -->"
MD_COLUMNS = [("load", "load", "{:.2f}"), ("policy", "policy", "{}"), ("mean E2EL s", "mean_e2el_ms", "{:.2f}"),
              ("P99 E2EL s", "p99_e2el_ms", "{:.2f}"), ("mean TTFT s", "mean_ttft_ms", "{:.2f}"),
              ("short P99 s", "short_p99_e2el_ms", "{:.2f}"), ("long P99 wait s", "long_p99_queue_wait_ms", "{:.2f}"),
              ("goodput req/s", "request_goodput", "{:.2f}")]  # fmt: skip


def run_bench(out: Path) -> str:
    """The default `presched bench`'s printed output, less its last line (wall time)."""
    r = subprocess.run([sys.executable, "-m", "presched.cli", "bench", "-o", str(out)],
                       capture_output=True, text=True, check=True)  # fmt: skip
    lines = r.stdout.rstrip("\n").split("\n")
    last = max(i for i, line in enumerate(lines) if line.startswith("wrote "))
    return "\n".join(line.rstrip() for line in lines[:last])


def sample_in(text: str) -> str:
    """The fenced block between the markers of README.md's `text`."""
    m = re.search(re.escape(BEGIN) + r"\n```\n(.*?)\n```\n" + re.escape(END), text, re.S)
    if m is None:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    return m.group(1)


def markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(c[0] for c in MD_COLUMNS) + " |\n|" + "---|" * len(MD_COLUMNS)
    body = []
    for row in rows:
        if row["load"] < 0.9:
            continue
        cells = [
            c[2].format(row[c[1]] / 1e3 if c[1].endswith("_ms") else row[c[1]]) for c in MD_COLUMNS
        ]
        body.append("| " + " | ".join(cells) + " |")
    return head + "\n" + "\n".join(body)


def _replace(text: str, new: str, fence: bool) -> str:
    inner = f"```\n{new}\n```" if fence else new
    return re.sub(
        re.escape(BEGIN) + r".*?" + re.escape(END),
        lambda _: f"{BEGIN}\n{inner}\n{END}",
        text,
        flags=re.S,
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    args = ap.parse_args()
    readme, bench_md = ROOT / "README.md", ROOT / "docs" / "bench.md"
    with tempfile.TemporaryDirectory() as tmp:
        out = run_bench(Path(tmp))
        if args.check:
            same = sample_in(readme.read_text()) == out
            print(
                "README.md's sample is the output of `presched bench`"
                if same
                else "README.md's sample differs"
            )
            sys.exit(0 if same else 1)
        rows = json.loads((Path(tmp) / "bench.json").read_text())["rows"]
        readme.write_text(_replace(readme.read_text(), out, fence=True))
        bench_md.write_text(_replace(bench_md.read_text(), markdown(rows), fence=False))
        shutil.copy(Path(tmp) / "bench.png", ROOT / "docs" / "bench-default.png")
    print("wrote README.md, docs/bench.md and docs/bench-default.png")


if __name__ == "__main__":
    main()
