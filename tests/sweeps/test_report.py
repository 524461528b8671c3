from __future__ import annotations

import pandas as pd
import pytest

from m4ray.sweeps import report


def _frame(backends: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "scenario_id": f"s{i}",
                "backend": name,
                "n_degraded": 2,
                "reduction": 4 + i,
                "completion_time_s": t,
                "wall_s": 1.0,
                "status": "ok",
            }
            for name, times in backends.items()
            for i, t in enumerate(times)
        ]
    )


def test_the_error_table_says_what_ns3_again_measures():
    """A second ns-3 run sent later is scored like any backend, and the table says that its
    error is ns-3's own spread; without it no such line."""
    frame = _frame({"ns3": [1.0, 2.0], "ns3_again": [1.02, 1.96], "flowsim": [0.9, 2.2]})
    errors = report.errors_vs(frame, "ns3")
    spread = errors[errors.backend == "ns3_again"]
    assert spread.abs_error.mean() == pytest.approx(0.02)
    text = report.error_text(errors, "ns3")
    assert "ns3_again: ns3 itself" in text and "own\nspread" in text
    assert "itself" not in report.error_text(errors[errors.backend == "flowsim"], "ns3")
