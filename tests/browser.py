"""Open an HTML file in headless Chromium (Debian's /usr/bin/chromium, driven by playwright) and report
what a person would get: script errors, console errors, dialogs, network requests, rendered DOM.

Chromium is a hard requirement (tests fail, not skip, without it): install it with .ci/install_browser.sh.
"""

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")


@dataclass
class RenderResult:
    page_errors: list[str] = field(default_factory=list)  # uncaught exceptions
    console_errors: list[str] = field(default_factory=list)  # console.error messages
    dialogs: list[str] = field(default_factory=list)  # alert/confirm/prompt messages (dismissed)
    external_requests: list[str] = field(default_factory=list)  # non-local URLs asked for (aborted)
    missing: list[str] = field(default_factory=list)  # wait_for selectors not matched in time
    counts: dict[str, int] = field(default_factory=dict)  # CSS selector -> number of elements
    text: str = ""  # document.body.innerText
    dom: str = ""  # serialized DOM after scripts ran
    page_width: int = 0  # document width in CSS px (wider than the viewport: a horizontal scroll bar)
    boxes: dict[str, dict[str, float] | None] = field(default_factory=dict)  # selector -> first's box

    @property
    def script_errors(self) -> list[str]:
        return self.page_errors + self.console_errors


def render_in_chromium(
    html_path: str | Path,
    selectors: tuple[str, ...] = (),
    wait_for: dict[str, int] | None = None,
    timeout_s: float = 60.0,
    viewport: tuple[int, int] = (1400, 900),
    screenshot: str | Path | None = None,
    clicks: tuple[str, ...] = (),
) -> RenderResult:
    """Load html_path, wait (up to timeout_s in all) until each `wait_for` CSS selector matches at
    least its number of elements, then collect a RenderResult; `counts` covers `selectors`.

    Every request that is not file:/data:/blob: is recorded and aborted, so the page is checked offline.
    The page is a `viewport` (width, height) window; `boxes` holds the bounding box (x, y, width,
    height in page pixels) of the first element of each of `selectors`; `screenshot` saves the first
    screen as PNG. `clicks`: CSS selectors whose first elements are clicked, in order, after loading and
    before anything is measured.
    """
    if shutil.which(CHROMIUM) is None:
        raise FileNotFoundError(f"{CHROMIUM} not found; install it with: bash .ci/install_browser.sh")
    html_path = Path(html_path).resolve()
    if not html_path.is_file():
        raise FileNotFoundError(f"no HTML file at {html_path}")

    result = RenderResult()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.set_default_timeout(timeout_s * 1000)
            page.on("pageerror", lambda error: result.page_errors.append(str(error)))
            page.on(
                "console",
                lambda msg: result.console_errors.append(msg.text) if msg.type == "error" else None,
            )
            page.on("dialog", lambda dialog: (result.dialogs.append(dialog.message), dialog.dismiss()))

            def block_external(route):
                result.external_requests.append(route.request.url)
                route.abort()

            page.route(lambda url: not url.startswith(LOCAL_SCHEMES), block_external)
            page.goto(html_path.as_uri(), wait_until="load")
            deadline = time.monotonic() + timeout_s
            for selector, n_elements in (wait_for or {}).items():
                try:
                    page.wait_for_function(
                        "([selector, n]) => document.querySelectorAll(selector).length >= n",
                        arg=[selector, n_elements],
                        timeout=max(deadline - time.monotonic(), 0.001) * 1000,
                    )
                except PlaywrightError:
                    result.missing.append(selector)
            for selector in clicks:
                page.locator(selector).first.click()
            # Let pending React renders and effects finish: wait two animation frames.
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            result.counts = {s: page.locator(s).count() for s in selectors}
            result.boxes = {
                s: page.locator(s).first.bounding_box() if result.counts[s] else None for s in selectors
            }
            result.page_width = page.evaluate("() => document.documentElement.scrollWidth")
            if screenshot is not None:
                page.screenshot(path=str(screenshot))
            result.text = page.inner_text("body")
            result.dom = page.content()
        finally:
            browser.close()
    return result
