"""Regenerate the measured numbers of an m3 checkpoint's model card: run the benches that score it
and write what they print into the card, between markers (an earlier run's section is replaced).

    .venv/bin/python bench/m3_card.py checkpoints/m3-v4 [--shared ../shared/data] [--only NAME]

Every number in the section comes from the bench output pasted under it, with the command that
printed it; nothing is typed by hand (``bench/m4_card.py`` does the same for m4). For each
congestion control the checkpoint knows (``model.json`` ``supported_cc``):

* ``sampling-<cc>``: ``bench/m3_sampling.py`` — m3's default experiment (200,000 web-search flows
  on a k = 8 1:1 fat-tree) over 8 draws of 500 paths: the mean error (the model's bias) and rms
  (one run's) beside ns-3's own flows on the same paths, path flowSim and flowSim. Its
  network-wide ns-3 runs are cached by content under ``--output-dir`` (~3-4 minutes each the
  first time);
* ``fat-trees``: ``bench/m3_eval.py`` on k = 8 fat-trees at 1:1 and 2:1 (20,000 web-search flows,
  one draw each; ns-3 cached under ``outputs/bench/m3_card``);
* ``shared`` (with ``--shared``, DCTCP checkpoints): m4's example against the HPCC simulator's
  own DCTCP run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from m4_card import ROOT, card_of, card_parser, run_sections, write

TOOL = "bench/m3_card.py"


def commands(checkpoint: str, ccs: list[str], out: str, shared: Path | None) -> dict:
    py = sys.executable
    cmds = {
        f"sampling-{cc}": [
            py, "bench/m3_sampling.py", f"paths.output_dir={out}", f"m3.network.cc={cc}",
            f"m3.checkpoint={checkpoint}", "--paths", "500", "--draws", "8",
        ]
        for cc in ccs
    }  # fmt: skip
    evals = [py, "bench/m3_eval.py", "--checkpoint", checkpoint, "--mean", "20000"]
    cmds["fat-trees"] = [*evals, "--ccs", *ccs, "--oversub", "1", "2", "--out", f"{out}/eval"]
    if shared is not None and "dctcp" in ccs:
        cmds["shared"] = [
            *evals, "--ccs", "dctcp", "--oversub", "1", "--shared", str(shared),
            "--out", f"{out}/eval",
        ]  # fmt: skip
    return cmds


def main() -> None:
    parser = card_parser(__doc__)
    parser.add_argument(
        "--output-dir", default="outputs/bench/m3_card", help="where the benches cache ns-3"
    )
    args = parser.parse_args()
    card = card_of(args.checkpoint)
    info = json.loads((args.checkpoint / "model.json").read_text())
    checkpoint = os.path.relpath(args.checkpoint.resolve(), ROOT)  # as the benches take it
    cmds = commands(checkpoint, info.get("supported_cc", ["dctcp"]), args.output_dir, args.shared)
    sections = run_sections(cmds, args.only, drop="paths, draw ")
    write(card, sections, list(cmds), TOOL)
    print(f"wrote {len(sections)} sections into {card}")


if __name__ == "__main__":
    main()
