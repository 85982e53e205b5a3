"""The documentation: the generated reference says what the code says, and the site builds.

* ``docs/reference/{cli,environment,errors,ros}.md`` are regenerated from the code
  (``scripts/gen_reference.py``) and must equal the committed pages, so a new command, option,
  environment variable, error code or ROS parameter fails here until the page is regenerated.
* Every ``SEQ_*`` / ``SEQUENCES_*`` / ``SEQAI_*`` / ``SEQUENCE_AI_*`` name in the source has a
  description, and every description names a variable the source still has.
* ``mkdocs build --strict`` (plain mkdocs, its built-in theme: nothing is fetched) succeeds into a
  temporary folder, and every internal link of the built site and of README.md reaches a page
  that exists and, with a ``#fragment``, an element with that id -- and that fragment is also
  GitHub's anchor for the heading, so the link works on GitHub too.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen():
    return _load("gen_reference")


@pytest.mark.parametrize("page", ["cli.md", "environment.md", "errors.md", "ros.md"])
def test_the_committed_reference_page_is_what_the_code_gives(gen, page):
    text = gen.PAGES[page]().rstrip("\n") + "\n"
    committed = (REFERENCE / page).read_text(encoding="utf-8") if (REFERENCE / page).is_file() else ""
    assert committed == text, (f"docs/reference/{page} differs from what the code gives; run "
                               "`python scripts/gen_reference.py` and commit the page")


def test_every_environment_variable_in_the_source_is_described_and_every_description_is_used(gen):
    found = gen.scan_env_vars()
    assert "SEQUENCES_API_KEY" in found and "SEQ_WORKER_MAX_CONNECTIONS" in found   # the scan sees the code
    assert "SEQAI_NUMPY_INCLUDE_DIR" not in found                                    # a CMake variable, not env
    assert gen.env_problems(found, _load("reference_data").ENV_VARS) == []


def test_the_environment_scan_finds_a_new_variable_and_notices_a_stale_description(gen):
    described = dict(_load("reference_data").ENV_VARS)
    found = dict(gen.scan_env_vars())
    found["SEQ_SOMETHING_NEW"] = ["server/sequence_ai_server/x.py"]
    described["SEQ_GONE_NOW"] = ("server", "", "")
    problems = gen.env_problems(found, described)
    assert len(problems) == 2 and "SEQ_SOMETHING_NEW" in problems[0] and "SEQ_GONE_NOW" in problems[1]


def test_every_error_code_of_the_registry_has_a_note_and_no_note_is_stale():
    from sequence_ai_core.protocol import ERROR_CODES

    assert set(_load("reference_data").ERROR_NOTES) == set(ERROR_CODES)


# ---------------------------------------------------------------- the built site

class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                        str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    return out


def _internal(href: str) -> bool:
    parts = urlsplit(href)
    return not parts.scheme and not parts.netloc and not href.startswith("mailto:")


def test_the_site_builds_strict_and_every_internal_link_and_anchor_resolves(site):
    pages = {p: _parse(p) for p in site.rglob("*.html")}
    assert (site / "index.html") in pages and (site / "reference" / "environment.html") in pages
    broken = []
    for path, page in pages.items():
        if path.name == "404.html" or path.parent.name == "search":
            continue
        if re.search(r"<code>[^<]*\\\|", path.read_text(encoding="utf-8")):
            broken.append(f"{path.relative_to(site)}: a code span shows a backslash before a pipe")
        for href in page.links:
            if not _internal(href):
                continue
            parts = urlsplit(href)
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(site)}: {href} (no such file)")
            elif parts.fragment and target.suffix == ".html" and \
                    parts.fragment not in (pages.get(target) or _parse(target)).ids:
                broken.append(f"{path.relative_to(site)}: {href} (no element with that id)")
    assert not broken, "broken internal links:\n" + "\n".join(broken)


_MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_link_of_the_readme_reaches_a_page_and_anchor_of_the_site(site):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    broken, seen = [], 0
    for href in _MD_LINK.findall(text):
        if not _internal(href):
            continue
        seen += 1
        parts = urlsplit(href)
        path = (ROOT / parts.path).resolve()
        if not path.exists():
            broken.append(f"{href} (no such file)")
            continue
        if parts.fragment:
            rel = path.relative_to(ROOT / "docs").with_suffix(".html")
            if parts.fragment not in _parse(site / rel).ids:
                broken.append(f"{href} (no heading with that id)")
    assert seen >= 5, "README.md should link into docs/"
    assert not broken, "broken links in README.md:\n" + "\n".join(broken)


def _github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation but ``-`` and ``_``
    dropped, each space a ``-`` (so ``Wire: client -> worker`` is ``wire-client---worker``)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_fragment_link_in_the_markdown_also_resolves_on_github():
    # the site's anchors are mkdocs' (checked above); the same .md files are read on GitHub, whose
    # anchors differ for headings with punctuation: a fragment must be the same in both
    headings: dict = {}
    for md in (ROOT / "docs").rglob("*.md"):
        headings[md.resolve()] = {_github_slug(m) for m in re.findall(r"^#+ (.+)$", md.read_text(encoding="utf-8"), re.M)}
    broken = []
    for md in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        for href in _MD_LINK.findall(md.read_text(encoding="utf-8")):
            parts = urlsplit(href)
            if not _internal(href) or not parts.fragment:
                continue
            target = (md.parent / unquote(parts.path)).resolve() if parts.path else md.resolve()
            if target in headings and parts.fragment not in headings[target]:
                broken.append(f"{md.relative_to(ROOT)}: {href}")
    assert not broken, "fragments that are no GitHub heading anchor:\n" + "\n".join(broken)


def test_the_quickstarts_up_to_date_lines_are_what_bootstrap_prints():
    said = re.search(r'echo "(bootstrap: up to date [^"]*)"', (ROOT / "scripts" / "bootstrap.sh").read_text()).group(1)
    shape = re.escape(said).replace(re.escape("$PROFILE"), "(demo|test)").replace(re.escape("${secs}"), r"\d+\.\d")
    head = shape.split(r"\)", 1)[0] + r"\)"                          # the part up to the seconds
    shown = re.findall(r"bootstrap: up to date[^`\n]*", (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8"))
    assert shown and all(re.match(head, line) for line in shown), (said, shown)


def test_the_readme_is_short_and_opens_with_the_two_commands_for_a_fresh_machine():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; the details belong in docs/"
    opening = "\n".join(lines[:6])
    assert "bash scripts/demo.sh" in opening and "bash scripts/test.sh" in opening
