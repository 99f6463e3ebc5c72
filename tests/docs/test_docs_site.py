"""The documentation site: built once per module with warnings as errors (as ``make docs``
and CI build it), then checked as a reader meets it: every relative link and anchor of the
built pages resolves, every public name has its API entry, headless chromium renders the
index and ``submit``'s page with its signature. The Markdown sources' links (README.md
included) resolve inside the repository, and the README's quickstart is the file the
quickstart test runs."""

from __future__ import annotations

import html
import importlib
import inspect
import re
import shutil
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from examples_util import run

pytest.importorskip("sphinx", reason="the docs extra is not installed (make setup installs it)")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: Seconds the site's build may take (about 10 s on a loaded 2-core machine).
BUILD_TIMEOUT_S = 600.0
#: Seconds a page render may take in chromium.
RENDER_TIMEOUT_S = 120.0
#: The modules whose ``__all__`` the API reference documents (``dask_ddp.predict`` too once
#: it exists).
PUBLIC_MODULES = ("dask_ddp", "dask_ddp.dispatch", "dask_ddp.data", "dask_ddp.data.transforms",
                  "dask_ddp.results", "dask_ddp.checkpoint", "dask_ddp.storage",
                  "dask_ddp.predict")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built from docs/ into a temporary folder, as `make docs` builds it."""
    out = tmp_path_factory.mktemp("docs-html")
    # Fails with sphinx's stderr when the build fails (warnings are errors) or times out.
    run([sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going", "-q",
         "-d", str(out / ".doctrees"), str(DOCS), str(out)], cwd=ROOT, timeout=BUILD_TIMEOUT_S)
    return out


class _Links(HTMLParser):
    """The ids of a page and the links (href, src) it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if value is None:
                continue
            if key in ("id", "name"):
                self.ids.add(value)
            elif key in ("href", "src") and tag != "base":
                self.links.append(value)


def _parse(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def test_every_relative_link_of_the_site_resolves(site: Path) -> None:
    # _static/ holds the theme's assets (a Jinja template among them), not pages.
    pages = sorted(p for p in site.rglob("*.html") if "_static" not in p.relative_to(site).parts)
    assert len(pages) >= 30, f"only {len(pages)} pages built: {[p.name for p in pages]}"
    parsed = {page: _parse(page) for page in pages}
    broken: list[str] = []
    for page, links in parsed.items():
        for link in links.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("//"):
                continue  # an external address: not checked (no network in tests)
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{page.relative_to(site)}: {link} (no such file)")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    assert not broken, "broken links in the built site:\n" + "\n".join(broken)


def _public(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    assert names, f"{module_name} has no __all__: its public names are unknown"
    return list(names)


def test_every_public_name_has_an_api_entry(site: Path) -> None:
    anchors: set[str] = set()
    for page in (site / "api").glob("*.html"):
        anchors |= {i for i in _parse(page).ids if i.startswith(("dask_ddp", "module-dask_ddp"))}
    # An object re-exported by several modules is documented once, where it lives.
    documented: dict[int, str] = {}
    for anchor in anchors:
        name = anchor.removeprefix("module-")
        parent, _, attr = name.rpartition(".")
        try:
            obj = importlib.import_module(name) if anchor.startswith("module-") else \
                getattr(importlib.import_module(parent), attr)
        except (ImportError, AttributeError, ValueError):
            continue
        documented.setdefault(id(obj), anchor)
    missing: list[str] = []
    for module_name in PUBLIC_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue  # not written yet
        for name in _public(module_name):
            obj = getattr(module, name)
            if f"{module_name}.{name}" in anchors or id(obj) in documented:
                continue
            if inspect.ismodule(obj) and f"module-{obj.__name__}" in anchors:
                continue
            missing.append(f"{module_name}.{name}")
    assert not missing, f"public names without an API entry (docs/api/*.md): {missing}"


def _chromium_dom(page: Path) -> str:
    """The DOM of a built page after headless chromium ran its scripts."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="dask-ddp-chromium-") as profile:
        return run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
                    "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                    "--virtual-time-budget=3000", "--dump-dom", page.as_uri()],
                   cwd=Path(profile), timeout=RENDER_TIMEOUT_S).stdout


def _text(dom: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", dom)))


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                    "(tools/setup_apt.sh installs it)")
def test_chromium_renders_the_index_and_submits_signature(site: Path) -> None:
    index = _text(_chromium_dom(site / "index.html"))
    for expected in ("dask-ddp", "Getting started", "User guide", "API reference"):
        assert expected in index, f"the index page lacks {expected!r}: {index[:2000]}"

    import dask_ddp

    text = _text(_chromium_dom(site / "api" / "dispatch.html"))
    start = text.find("dask_ddp.dispatch.submit(")
    assert start >= 0, f"no signature of submit on its API page: {text[:3000]}"
    signature = text[start:text.index(")", text.index("**kwargs", start))]
    names = list(inspect.signature(dask_ddp.submit).parameters)
    at = 0
    for name in names:  # each parameter, in order, as a name of the signature
        found = re.compile(rf"(?<![\w.])\**{name}\b").search(signature, at)
        assert found, f"submit's page shows {signature!r}: no parameter {name!r} after {at}"
        at = found.end()


def _md_links(path: Path) -> list[str]:
    text = re.sub(r"(?s)```.*?```", "", path.read_text(encoding="utf-8"))  # not in code
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_markdown_links_resolve_inside_the_repository() -> None:
    sources = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    broken: list[str] = []
    for source in sources:
        for link in _md_links(source):
            parts = urlsplit(link)
            if parts.scheme or not parts.path:
                continue
            target = (source.parent / unquote(parts.path)).resolve()
            if not target.exists() or not target.is_relative_to(ROOT):
                broken.append(f"{source.relative_to(ROOT)}: {link}")
    assert not broken, "links to files that are not in the repository:\n" + "\n".join(broken)


def _fenced_python(markdown: str, heading: str) -> str:
    """The first ```python block after ``heading`` in a Markdown text."""
    section = markdown[markdown.index(heading):]
    match = re.search(r"(?ms)^```python\n(.*?)^```", section)
    assert match, f"no python block under {heading!r}"
    return match.group(1)


def test_readme_quickstart_is_the_example_that_runs() -> None:
    readme = _fenced_python((ROOT / "README.md").read_text(encoding="utf-8"), "## Quickstart")
    example = (ROOT / "examples" / "quickstart.py").read_text(encoding="utf-8")
    body = example[example.index("from __future__ import annotations"):]
    assert readme == body, ("README's quickstart differs from examples/quickstart.py (from "
                            "'from __future__' on): copy the file into the README")


def test_examples_page_shows_every_example() -> None:
    page = (DOCS / "examples.md").read_text(encoding="utf-8")
    included = set(re.findall(r"```\{literalinclude\} \.\./examples/(\S+\.py)", page))
    scripts = {p.name for p in (ROOT / "examples").glob("*.py")}
    assert scripts <= included, f"examples not on docs/examples.md: {sorted(scripts - included)}"


def test_site_metadata_names_the_documentation() -> None:
    import tomllib

    project: dict[str, Any] = tomllib.loads(
        (ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    # The site is built locally (`make docs`), not published: the metadata names no
    # address where nothing is, and the README says how to build it.
    url = project.get("urls", {}).get("Documentation")
    assert url is None, f"project.urls.Documentation names {url!r}, where no site is published"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make docs" in readme and "published at" not in readme
    assert "docs" in project["optional-dependencies"], "no docs extra in pyproject.toml"
