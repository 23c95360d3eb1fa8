"""No module of semel is over 600 lines.

A module past that size has grown more than one job; docs/architecture.md splits it
by composition (a cohesive part moved into its own module as a class that owns its
state), and this test keeps every module within the limit once split.
"""
from __future__ import annotations

from pathlib import Path

import semel

MAX_LINES = 600
ROOT = Path(semel.__file__).parent


def line_count(path: Path) -> int:
    """Lines as an editor numbers them: a last line without a newline counts too."""
    with path.open("rb") as f:
        return sum(1 for _ in f)


def oversized(root: Path, limit: int = MAX_LINES) -> list[str]:
    """'path: N lines' for each .py file under `root` longer than `limit`, largest first."""
    counts = [(line_count(p), p.relative_to(root.parent)) for p in sorted(root.rglob("*.py"))]
    return [f"{p}: {n} lines" for n, p in sorted(counts, key=lambda c: -c[0]) if n > limit]


def test_every_semel_module_is_at_most_600_lines():
    assert len(list(ROOT.rglob("*.py"))) > 100    # the walk found the package's modules
    offenders = oversized(ROOT)
    assert offenders == [], (f"modules over {MAX_LINES} lines (split each by composition, "
                             f"docs/architecture.md):\n" + "\n".join(offenders))


def test_the_count_sees_a_601_line_module_and_passes_600(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "ok.py").write_text("x = 1\n" * 600)
    (pkg / "sub" / "big.py").write_text("x = 1\n" * 600 + "y = 2")   # no newline at the end
    assert line_count(pkg / "sub" / "big.py") == 601
    assert oversized(pkg) == ["pkg/sub/big.py: 601 lines"]
