"""The project speaks of itself only: by version, date and commit, never of work sessions, engineers
or issue numbers (history lives in git, measured figures in bench/results). The README stays a short
entry point whose every link stays inside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# How a lab notebook speaks: numbered work sessions, other people, tracker numbers. (`[ ]` is a
# plain space, written so that this line does not match itself.)
NOTEBOOK_VOICE = re.compile(r"session[ ][0-9]|another[ ]engineer|issue[ ][0-9]", re.IGNORECASE)
README_MAX_LINES = 150
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# Bare paths that leave the checkout: a parent-relative path, or an absolute one under a root
# where checkouts and their neighbours live.
BARE_OUTSIDE_PATH = re.compile(
    r"(?<![\w.])\.\./[\w.-]|(?<![\w.:/-])/(?:work|home|root|tmp|mnt|Users|shared)/"
)


def _repo_files() -> list[Path]:
    """Tracked files and new ones git does not ignore: what the repository holds or will hold."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted({REPO / name for name in out.split("\0") if name})


def _text(path: Path) -> str | None:
    """The file as text, or None for anything that is not a readable text file (binary, a link to
    a folder, a file deleted in the work tree)."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def test_no_file_speaks_of_sessions_engineers_or_issue_numbers() -> None:
    hits = []
    for path in _repo_files():
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if NOTEBOOK_VOICE.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}")
    assert not hits, (
        "say it by version, date or commit (history lives in git, figures in bench/results):\n"
        + "\n".join(hits)
    )


def test_the_scan_sees_the_files_it_must_check() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _repo_files()}
    assert {"README.md", "docs/architecture.md", "tests/unit/test_project_voice.py"} <= names


def test_the_readme_is_short() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move detail to docs/"
    )


def test_every_readme_link_stays_inside_the_repository() -> None:
    readme = (REPO / "README.md").read_text()
    bad = []
    for target in MARKDOWN_LINK.findall(readme):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in this file
        path = (REPO / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(REPO):
            bad.append(f"{target}: outside the repository")
        elif not path.exists():
            bad.append(f"{target}: no such file or folder")
    for number, line in enumerate(readme.splitlines(), 1):
        if BARE_OUTSIDE_PATH.search(line):
            bad.append(f"line {number}: a path outside the repository: {line.strip()[:120]}")
    assert not bad, "README.md:\n" + "\n".join(bad)


def test_the_architecture_doc_exists() -> None:
    assert (REPO / "docs" / "architecture.md").is_file()
