"""README.md and the docs/ pages as a reader uses them: every file a command names is in the repository, every
link leads somewhere, every block marked ``<!-- runnable -->`` runs as pasted (on the simulator, in an empty
folder with the repository's search spaces beside it), and every pasted transcript is what the current code
prints (``benchmarks/readme_outputs.py --check``: run times masked, real-time runs not compared)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
#: Paths into the repository as commands name them.
REPO_PATH = re.compile(r"(?<![\w/.~$-])((?:search_spaces|benchmarks|tests|notebooks|docs|\.ci)/[\w./-]+\.\w+)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def name(page: Path) -> str:
    return str(page.relative_to(REPO))


def blocks(page: Path) -> list[tuple[int, str, str, bool]]:
    """(line, language, text, runnable) of each fenced block of ``page``."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip().splitlines()[-1:] or [""]
        out.append((line, m.group(1), m.group(2), before[0].strip() == "<!-- runnable -->"))
    return out


def test_every_file_a_command_names_is_in_the_repository():
    missing = [f"{name(page)}:{line}: {path}" for page in PAGES for line, lang, text, _ in blocks(page)
               if lang in ("bash", "text", "python", "") for path in REPO_PATH.findall(text)
               if "NAME" not in path and not (REPO / path).exists()]
    assert not missing, missing


def test_every_relative_link_leads_to_a_file():
    broken = [f"{name(page)}: {target}" for page in PAGES for target in LINK.findall(page.read_text(encoding="utf-8"))
              if "://" not in target and not (page.parent / target).exists()]
    assert not broken, broken


def test_readme_is_read_in_five_minutes():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines: move the detail into a docs/ page"


def test_some_blocks_are_marked_runnable():
    assert any(runnable for page in PAGES for *_, runnable in blocks(page))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_runnable_blocks_run_as_pasted(tmp_path):
    (tmp_path / "search_spaces").symlink_to(REPO / "search_spaces")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg", "COLUMNS": "120"}
    for page in PAGES:
        for line, lang, text, runnable in blocks(page):
            if not runnable:
                continue
            if lang == "python":
                argv = [sys.executable, "-c", text]
            elif lang == "bash":
                argv = ["bash", "-euo", "pipefail", "-c", text]
            else:
                pytest.fail(f"{name(page)}:{line}: a runnable block must be bash or python, not {lang!r}")
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=800)
            where = f"{name(page)}:{line}"
            assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            assert "Traceback" not in done.stderr, f"{where}: {done.stderr[-2000:]}"


#: The pages whose transcripts run in one folder, in reading order: a later page's commands use the study an
#: earlier one made (the quick start's, resumed, planned); each other page stands alone, so the groups run
#: side by side (pytest-xdist) and every page is in one of them (:func:`transcript_groups`).
CHAINED = ("README.md", "docs/study.md", "docs/capacity.md", "docs/traffic.md")


def transcript_groups() -> dict[str, list[str]]:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import readme_outputs

    with_transcripts = [name(p.path) for p in readme_outputs.pages() if p.transcripts]
    groups = {"quick start, study, capacity, traffic": [p for p in with_transcripts if p in CHAINED]}
    groups.update({page: [page] for page in with_transcripts if page not in CHAINED})
    return groups


#: Computed once, at collection (the pages' parse and benchmarks/ on sys.path: once per run).
GROUPS = transcript_groups()


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("group", GROUPS)
def test_every_pasted_transcript_is_what_the_code_prints_now(group):
    """Each ``$ command`` of a ``text`` block runs, in reading order in one folder, and prints what the page
    shows (run times masked); a page out of date names the command (regenerate: readme_outputs.py --write)."""
    pages = [arg for page in GROUPS[group] for arg in ("--page", page)]
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "readme_outputs.py"), "--check", *pages],
                          cwd=REPO, capture_output=True, text=True, timeout=1400)
    assert done.returncode == 0, done.stderr[-3000:]


def test_every_page_with_transcripts_is_checked_once_and_the_chain_in_reading_order():
    groups = GROUPS
    checked = [page for pages in groups.values() for page in pages]
    assert len(checked) == len(set(checked)) and set(CHAINED) <= set(checked)
    assert list(groups["quick start, study, capacity, traffic"]) == list(CHAINED)
