"""The built site as a reader sees it: formulas as MathML, pages offline.

The site is built once per session with `mkdocs build --strict` into a
temporary folder. The static tests read its HTML. The tests marked
`browser` open every page from disk in headless Chromium with the network
off (`make test-site`; `make test` deselects them).
"""

import html.parser
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import types
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md"))
# A formula in a page's Markdown, its code blocks and code spans left out.
CODE = re.compile(r"^```.*?^```$|`[^`\n]*`", re.MULTILINE | re.DOTALL)
FORMULA = re.compile(r"\\\(|\\\[")
WIDTH = 1280


def html_name(page):
    return page[: -len(".md")] + ".html"


def formulas(page):
    return len(FORMULA.findall(CODE.sub("", (DOCS / page).read_text())))


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The site, built with `mkdocs build --strict` once per session."""
    directory = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(directory)],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return directory


class _Text(html.parser.HTMLParser):
    """The text of an HTML page outside <code>, <pre>, <script> and <style>."""

    SKIPPED = {"code", "pre", "script", "style"}

    def __init__(self):
        super().__init__()
        self.depth = 0
        self.parts = []

    def handle_starttag(self, tag, attrs):
        self.depth += tag in self.SKIPPED

    def handle_endtag(self, tag):
        self.depth -= tag in self.SKIPPED

    def handle_data(self, data):
        if not self.depth:
            self.parts.append(data)


def text_outside_code(page_html):
    parser = _Text()
    parser.feed(page_html)
    return "".join(parser.parts)


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_the_pages_with_formulas_are_found():
    with_formulas = {page for page in PAGES if formulas(page)}
    assert {"encodings/rotary.md", "encodings/sinusoidal.md"} <= with_formulas
    assert "results.md" not in with_formulas


def test_every_page_is_built_as_an_html_file(site):
    built = {str(path.relative_to(site)) for path in site.rglob("*.html")}
    assert built == {html_name(page) for page in PAGES} | {"404.html"}


@pytest.mark.parametrize("page", PAGES)
def test_formulas_are_mathml_and_no_tex_is_left(site, page):
    page_html = (site / html_name(page)).read_text()
    text = text_outside_code(page_html)
    assert "\\(" not in text and "\\[" not in text
    assert page_html.count("<math ") >= formulas(page)


def test_the_hook_renders_tex_and_refuses_what_it_cannot():
    hooks = load_hooks()
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_path="page.md"))
    content = hooks.on_page_content(
        '<p><span class="arithmatex">\\(a &lt; b_i\\)</span></p>'
        '<div class="arithmatex">\\[\n\\frac{1}{2}\n\\]</div>',
        page=page,
    )
    assert 'display="inline"><mrow><mi>a</mi>' in content
    assert 'display="block"><mrow><mfrac>' in content
    assert "<mo>&#x0003C;</mo>" in content and "\\" not in content
    # latex2mathml keeps an unknown command as the text "\unknown", and the
    # `&` of an unknown environment bare.
    for tex in ("\\unknown x", "\\begin{aligned} a &amp;= b \\end{aligned}"):
        with pytest.raises(ValueError, match="page.md: latex2mathml leaves"):
            hooks.on_page_content(
                f'<span class="arithmatex">\\({tex}\\)</span>', page=page
            )


def test_the_api_page_leads_with_the_layers(site):
    import keras_posenc

    api = (site / "api.html").read_text()
    headings = re.findall(r'<h3 id="([^"]+)" class="doc doc-heading">', api)
    layers = [name for name in keras_posenc.__all__ if name[0].isupper()]
    assert sorted(headings[: len(layers)]) == [f"keras_posenc.{n}" for n in layers]
    assert headings[len(layers)].startswith("keras_posenc.ops.")
    assert not re.search(r'id="keras_posenc\.[\w.]*\.(_|check_)', api)
    assert "Bases:" not in api


# Headless Chromium, network off: every page as a reader opens it from disk.
BROWSER_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser():
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("No chromium on PATH: apt-get install -y chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("No playwright: pip install playwright (the test extra)")
    with sync_playwright() as playwright:
        # Playwright gives Chromium a fresh profile and --no-sandbox itself.
        chromium = playwright.chromium.launch(
            executable_path=executable, args=BROWSER_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory):
    return tmp_path_factory.mktemp("screenshots")


@pytest.mark.browser
@pytest.mark.parametrize("page", PAGES)
def test_page_offline_in_chromium(site, browser, screenshots, page):
    context = browser.new_context(
        offline=True, viewport={"width": WIDTH, "height": 800}
    )
    tab = context.new_page()
    errors, requests = [], []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on(
        "console",
        lambda message: message.type == "error" and errors.append(message.text),
    )

    def local_only(route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            requests.append(route.request.url)
            route.abort()

    tab.route("**/*", local_only)
    tab.goto((site / html_name(page)).as_uri(), wait_until="load")
    screenshot = screenshots / (page[: -len(".md")].replace("/", "_") + ".png")
    tab.screenshot(path=screenshot, full_page=True)
    seen = tab.evaluate(
        """() => {
        const text = document.body.cloneNode(true);
        text.querySelectorAll("pre, code, script, style").forEach(e => e.remove());
        const fits = e => e.scrollWidth <= e.clientWidth + 1;
        return {
            text: text.textContent,
            math: [...document.querySelectorAll("math")].map(
                e => getComputedStyle(e).display),
            links: [...document.querySelectorAll(".md-nav a[href]")].map(a => a.href),
            pageWidth: document.documentElement.scrollWidth,
            overflowing: [...document.querySelectorAll(
                ".md-typeset__scrollwrap, div.arithmatex")].filter(e => !fits(e))
                .map(e => e.textContent.slice(0, 60)),
        };
    }"""
    )
    context.close()
    assert errors == [], (errors, requests)
    assert requests == []
    assert "\\(" not in seen["text"] and "\\[" not in seen["text"]
    # Chromium lays out MathML itself: `display: inline math` / `block math`.
    assert len(seen["math"]) >= formulas(page)
    assert all(display.endswith("math") for display in seen["math"]), seen["math"]
    # The navigation links every page, as a file that exists; its only
    # other link is the repository's.
    local = {link.split("#")[0] for link in seen["links"] if link.startswith("file:")}
    assert {(site / html_name(p)).as_uri() for p in PAGES} <= local
    for link in local:
        assert link.endswith(".html"), link
        assert pathlib.Path(urllib.request.url2pathname(link[5:])).is_file(), link
    others = {link for link in seen["links"] if not link.startswith("file:")}
    assert others <= {"https://github.com/keras-posenc/keras-posenc"}
    assert seen["pageWidth"] <= WIDTH
    # Nor does a table or a display formula hide part of itself behind a
    # scroll bar of its own.
    assert seen["overflowing"] == []


@pytest.mark.browser
@pytest.mark.parametrize("page", PAGES)
def test_code_blocks_fit_the_page_at_1280_px(site, browser, page):
    """No code block hides the end of a line behind a scroll bar."""
    context = browser.new_context(
        offline=True, viewport={"width": WIDTH, "height": 800}
    )
    tab = context.new_page()
    tab.goto((site / html_name(page)).as_uri(), wait_until="load")
    overflowing = tab.evaluate(
        """() => [...document.querySelectorAll(".md-typeset pre > code")]
            .filter(e => e.scrollWidth > e.clientWidth + 1)
            .map(e => e.textContent.split("\\n").reduce(
                (a, b) => (b.length > a.length ? b : a)))"""
    )
    context.close()
    assert overflowing == [], f"the longest line of each block too wide: {overflowing}"
