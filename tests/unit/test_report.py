import json
from pathlib import Path

from asyncdapo.tools.local.report import read_metrics, write_report


def test_report_from_partial_metrics(tmp_path: Path) -> None:
    rows = [
        {
            "step": 1,
            "reward/mean": 0.1,
            "acc/mean": 0.2,
            "rollout/valid_group_ratio": 0.5,
            "rollout/aborted_tokens": 10,
        },
        {"step": 2, "reward/mean": 0.3, "acc/mean": 0.4, "val/accuracy": 0.35, "timing/wait_s": 1.5},
    ]
    text = "\n".join(json.dumps(r) for r in rows) + '\n{"step": 3, "rew'  # interrupted mid-line
    (tmp_path / "metrics.jsonl").write_text(text)
    assert read_metrics(tmp_path / "metrics.jsonl") == rows
    md = write_report(tmp_path, {"run": "tiny", "val_acc_after": 0.35})
    body = md.read_text()
    assert "# Run report: tiny" in body and "| val_acc_after | 0.350 |" in body
    assert "| 2 | 0.300 | 0.400 | 0.350 |" in body
    png = tmp_path / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
