"""The docs' figures are the last runs' figures: docs/results is what scripts/results_pages.py
makes of benchmarks/results/*.json (regenerate it after a benchmark), and the README stays a
five-minute read."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# Lines a page takes from git history rather than from its JSON: any later commit to the code a
# result measures adds the staleness flag, so comparing them would fail every commit after a
# benchmark run (it failed CI once) while saying nothing about the page matching its JSON.
_HISTORY = ("> **Possibly stale**", "> Commit `")


def _from_json(page: str) -> str:
    keep = []
    for line in page.splitlines():
        if (
            line == ">"
            or (line.startswith(_HISTORY) and "not in this clone" in line)
            or (line.startswith(_HISTORY[0]))
        ):
            continue
        keep.append(line)
    return "\n".join(keep)


def test_results_pages_are_generated_from_the_results_json(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "results_pages", ROOT / "scripts/results_pages.py"
    )
    assert spec is not None and spec.loader is not None
    pages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pages)
    pages.main(tmp_path)
    made = {p.name: _from_json(p.read_text()) for p in tmp_path.glob("*.md")}
    kept = {p.name: _from_json(p.read_text()) for p in (ROOT / "docs/results").glob("*.md")}
    assert set(made) == set(kept), "run python scripts/results_pages.py"
    stale = [name for name in made if made[name] != kept[name]]
    assert not stale, f"{stale} differ from their JSON: run python scripts/results_pages.py"


def test_a_page_names_every_commit_its_rows_were_measured_at() -> None:
    """A benchmark run with --merge keeps the saved rows of what it did not measure again:
    the page lists each row commit (and flags those it cannot find), not only the last run's."""
    spec = importlib.util.spec_from_file_location(
        "results_pages", ROOT / "scripts/results_pages.py"
    )
    assert spec is not None and spec.loader is not None
    pages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pages)
    rows = [{"commit": "fffffff"}, {"commit": "eeeeeee"}, {"commit": "eeeeeee"}]
    merged = pages.provenance_note({"commit": "fffffff", "rows": rows}, "x.py", ["x.py"])
    assert "several commits" in merged and "`eeeeeee` (2), `fffffff` (1)" in merged
    assert "Commit `fffffff`, `eeeeeee` not in this clone's history" in merged
    one = pages.provenance_note({"commit": "fffffff", "rows": rows[:1]}, "x.py", ["x.py"])
    assert "several commits" not in one and "different CPUs" not in one
    cpus = [{"commit": "fffffff", "cpu_id": "family 25 model 17 stepping 1"}, *rows[:2]]
    mixed = pages.provenance_note({"commit": "fffffff", "rows": cpus}, "x.py", ["x.py"])
    assert "different CPUs" in mixed
    assert "not recorded (2), family 25 model 17 stepping 1 (1)" in mixed


def test_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024
    import re

    for link in re.findall(r"\]\(([^)#]+)\)", readme):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link
