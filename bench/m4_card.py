"""Regenerate the measured numbers of an m4 checkpoint's model card: run the benches that score it
and write what they print into the card, between markers (an earlier run's section is replaced).

    .venv/bin/python bench/m4_card.py checkpoints/m4-v2 [--shared ../shared/data] [--only NAME]

Every number in the section comes from the bench output pasted under it, with the command that
printed it; nothing is typed by hand. The benches (each also runs on its own):

* ``holdout``: ``bench/m4_holdout.py`` — per-flow error on topologies no training family has;
* ``incast``: ``bench/incast.py`` — k:1 incasts against ns-3;
* ``sweep``: the default gray-failure sweep (105 scenarios, scale 0.08) with this checkpoint;
* ``scale1``: the same sweep at scale 1 on N 2/8/16 x R 4/7/10 (9 scenarios);
* ``m4_example`` and ``simai_study`` (with ``--shared``): the field's own files
  (``bench/m4_example.py``, ``bench/simai_study.py``).

m4-small runs beside the checkpoint where a bench takes several. Sweep outputs go to
``outputs/card-<checkpoint name>-*``; ns-3 runs are cached by content there.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- bench/m4_card.py: begin (generated; do not edit) -->"
END = "<!-- bench/m4_card.py: end -->"
GRID_SCALE1 = ["grid.n=[2,8,16]", "grid.r=[4,7,10]", "workload.scale=1"]


def commands(checkpoint: str, name: str, shared: Path | None) -> dict[str, list[str]]:
    py = sys.executable
    sweep = [
        py,
        "-m",
        "m4ray.sweeps",
        "+experiment=gray_failure",
        f"backend_options.m4.checkpoint={checkpoint}",
        "progress=false",
    ]
    out = {
        "holdout": [py, "bench/m4_holdout.py", "--m4", "m4-small", checkpoint, "--scenarios", "1"],
        "incast": [py, "bench/incast.py", "--m4", "m4-small", checkpoint],
        "sweep": [*sweep, f"name=card-{name}-sweep"],
        "scale1": [*sweep, f"name=card-{name}-scale1", *GRID_SCALE1],
    }
    if shared is not None:
        out["m4_example"] = [
            py, "bench/m4_example.py", str(shared / "m4_example"), "--m4", "m4-small", checkpoint
        ]  # fmt: skip
        out["simai_study"] = [
            py, "bench/simai_study.py", str(shared), "--backends", "ns3", "flowsim",
            "m4=m4-small", f"m4={checkpoint}",
        ]  # fmt: skip
    return out


def run(cmd: list[str]) -> tuple[str, float]:
    """The command's standard output (it must succeed) and its wall time."""
    shown = " ".join(cmd[1:] if cmd[0] == sys.executable else cmd)
    print(f"$ {shown}", flush=True)
    began = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"failed ({done.returncode}): {shown}")
    return done.stdout, wall


def keep_tables(stdout: str) -> str:
    """What to paste: the output without progress and logging lines."""
    noise = re.compile(r"^(\S+ \S+ INFO |\(\w+ pid=|.*it/s\]|.*run/s\]|\s*$)")
    return "\n".join(line for line in stdout.splitlines() if not noise.match(line))


def written(text: str) -> dict[str, str]:
    """The sections a card already has, by name (their text, heading included)."""
    block = re.search(re.escape(BEGIN) + "(.*?)" + re.escape(END), text, re.S)
    if block is None:
        return {}
    pieces = re.split(r"^(?=### )", block.group(1), flags=re.M)[1:]
    return {piece.split()[1]: piece.rstrip("\n") + "\n" for piece in pieces}


def write(card: Path, sections: dict[str, tuple[list[str], str, float]], order: list[str]) -> None:
    """Write ``sections`` into the card's generated block; sections that were not run keep
    their earlier text (``--only``), those of ``order`` in its place and any others after them
    (a section of a bench this run could not run, e.g. one that needs ``--shared``)."""
    text = card.read_text()
    earlier = written(text)
    old = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END) + "\n?", re.S)
    parts = [BEGIN, "## Measured (bench/m4_card.py)", ""]
    for name in [*order, *(n for n in earlier if n not in order)]:
        if name not in sections:
            if name in earlier:
                parts.append(earlier[name])
            continue
        cmd, stdout, wall = sections[name]
        shown = " ".join(["python", *cmd[1:]] if cmd[0] == sys.executable else cmd)
        parts += [f"### {name}", "", f"`{shown}` ({wall:.0f} s)", "", "```", stdout, "```", ""]
    section = "\n".join(parts) + END + "\n"
    text = old.sub("", text).rstrip("\n") + "\n\n" + section
    card.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="the checkpoint directory (its card)")
    parser.add_argument("--shared", type=Path, help="the shared data folder (the field's files)")
    parser.add_argument(
        "--only", nargs="+", help="rerun these sections only (the card keeps the others)"
    )
    args = parser.parse_args()
    card = args.checkpoint / "model_card.md"
    if not card.exists():
        raise SystemExit(f"{card}: no model card to write into")
    shipped = args.checkpoint.resolve().parent == ROOT / "checkpoints"
    checkpoint = args.checkpoint.name if shipped else str(args.checkpoint.resolve())
    cmds = commands(checkpoint, args.checkpoint.name, args.shared)
    sections = {}
    for name, cmd in cmds.items():
        if args.only and name not in args.only:
            continue
        stdout, wall = run(cmd)
        sections[name] = (cmd, keep_tables(stdout), wall)
        print(sections[name][1], flush=True)
    write(card, sections, list(cmds))
    print(f"wrote {len(sections)} sections into {card}")


if __name__ == "__main__":
    main()
