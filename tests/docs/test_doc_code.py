"""The code of the documentation runs as written: the quickstart (``examples/quickstart.py``,
which getting-started includes and README copies) on a real LocalCluster, and every Python
block of the getting-started page and the user guide that is not marked as a fragment (an
HTML comment ``<!-- not run: why -->`` right before it), one subprocess per page."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from examples_util import run

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: The pages whose Python blocks run (the API pages hold no blocks of their own).
PAGES = sorted([DOCS / "getting-started.md", *(DOCS / "user-guide").glob("*.md")])
#: Seconds a page's blocks may take together.
PAGE_TIMEOUT_S = 120.0
#: Seconds the quickstart may take (14 s on a quiet machine: a LocalCluster, 2 ranks).
QUICKSTART_TIMEOUT_S = 300.0

#: A ```python block, and the fragment mark right before it if any.
_BLOCK = re.compile(r"(?ms)^(?:<!--\s*(?P<skip>not run:[^>]*?)\s*-->\n)?"
                    r"```python\n(?P<code>.*?)^```")


def runnable_blocks(markdown: str) -> list[str]:
    """The ```python blocks of a page that are not marked ``<!-- not run: ... -->``."""
    return [m["code"] for m in _BLOCK.finditer(markdown) if not m["skip"]]


def test_fragment_marks_are_read() -> None:
    page = ("<!-- not run: needs s3 -->\n```python\nraise SystemExit(1)\n```\n\n"
            "```python\nx = 1\n```\n")
    assert runnable_blocks(page) == ["x = 1\n"]
    marked = sum(len(re.findall(r"(?m)^<!-- not run:", p.read_text())) for p in PAGES)
    blocks = sum(len(re.findall(r"(?m)^```python$", p.read_text())) for p in PAGES)
    assert 0 < marked < blocks, f"{marked} of {blocks} blocks marked as fragments"


@pytest.mark.parametrize("page", [p for p in PAGES if runnable_blocks(p.read_text())],
                         ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_blocks_run(page: Path, tmp_path: Path) -> None:
    script = tmp_path / f"{page.stem}_blocks.py"
    script.write_text("\n".join(runnable_blocks(page.read_text(encoding="utf-8"))))
    # A failing block fails here with its stderr (mark fragments <!-- not run: why -->).
    run([sys.executable, str(script)], cwd=tmp_path, timeout=PAGE_TIMEOUT_S)


@pytest.mark.dask
@pytest.mark.slow
def test_quickstart_runs_as_a_file(tmp_path: Path) -> None:
    done = run([sys.executable, str(ROOT / "examples" / "quickstart.py")], cwd=tmp_path,
               timeout=QUICKSTART_TIMEOUT_S)
    losses = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(losses) == 2 and all(isinstance(x, float) for x in losses), done.stdout
    records = [json.loads(line) for line in
               (tmp_path / "runs" / "first" / "metrics.jsonl").read_text().splitlines()]
    assert {r["rank"] for r in records} == {0, 1} and all("loss" in r for r in records)
    checkpoints = sorted((tmp_path / "runs" / "first" / "ckpt").rglob("step-*.pt"))
    assert checkpoints, "the quickstart saved no checkpoint under runs/first/ckpt"
    # A script whose job succeeded ends quietly: no traceback, no value "lost".
    for alarm in ("Traceback", "lost with its worker", "bootstrapping phase"):
        assert alarm not in done.stderr, f"the quickstart printed {alarm!r}:\n{done.stderr}"
