"""The report in a real headless Chromium (Debian's chromium + chromedriver, driven by selenium).

Checks: the page loads with no console errors, the filters change what is shown, a trajectory
opens with its tokens styled by role, and a screenshot is written (kept in the test's tmp folder;
set SEARCHR1_SCREENSHOT_DIR to keep a copy). Skips with the reason when the browser is missing:
`scripts/install-browser.sh` installs it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from evalworld import scripted_records, write_run_folder

from searchr1.report import build_report

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="headless browser test needs chromium and chromedriver on PATH (run scripts/install-browser.sh)",
)


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="searchr1-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--no-first-run",
        "--disable-quic",
        "--window-size=1400,1800",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def visible_cards(driver):
    return driver.find_elements("css selector", "#traj-list details.traj")


def choose(driver, select_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", select_id)).select_by_value(value)


def rendered(card, selector: str = ".transcript .seg"):
    """The card's elements matching ``selector`` once its transcript is drawn: the page renders it on the
    ``toggle`` event, which the browser fires after the click returns."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(card.parent, 10).until(lambda _: card.find_elements("css selector", selector))


def severe(logs):
    return [e for e in logs if e.get("level") == "SEVERE"]


def test_report_in_headless_chromium(browser, tmp_path, tiny_tokenizer):
    run = write_run_folder(tmp_path / "run", tiny_tokenizer, steps=12, val_every=5)
    page = build_report(run)
    records = scripted_records(tiny_tokenizer, 10)  # what the page shows: the latest validation step
    browser.get(page.resolve().as_uri())
    assert browser.title.startswith("searchr1 report")
    assert severe(browser.get_log("browser")) == []

    assert len(visible_cards(browser)) == len(records) == 6
    assert "showing 6 of 6" in browser.find_element("id", "traj-count").text
    assert len(browser.find_elements("css selector", "#curves svg")) >= 9

    correct = [r for r in records if r["correct"]]
    assert 0 < len(correct) < len(records)
    choose(browser, "filter-correct", "correct")
    cards = visible_cards(browser)
    assert len(cards) == len(correct)
    assert all(c.get_attribute("data-correct") == "1" for c in cards)
    choose(browser, "filter-correct", "incorrect")
    assert len(visible_cards(browser)) == len(records) - len(correct)

    choose(browser, "filter-correct", "all")
    choose(browser, "filter-searches", "2")
    cards = visible_cards(browser)
    assert len(cards) == sum(r["searches"] == 2 for r in records) > 0
    assert {c.get_attribute("data-searches") for c in cards} == {"2"}

    choose(browser, "filter-searches", "all")
    choose(browser, "filter-source", "nq")
    assert len(visible_cards(browser)) == sum(r["data_source"] == "nq" for r in records)
    assert {c.get_attribute("data-source") for c in visible_cards(browser)} == {"nq"}

    # open a trajectory with searches: prompt, generated and retrieved tokens in three distinct styles
    choose(browser, "filter-source", "all")
    choose(browser, "filter-searches", "2")
    card = visible_cards(browser)[0]
    card.find_element("tag name", "summary").click()
    segs = rendered(card)
    roles = [s.get_attribute("class").split()[1] for s in segs]
    assert roles[0] == "prompt" and roles.count("observation") == 2 and "generated" in roles
    styles = {}
    for s, role in zip(segs, roles, strict=True):
        styles.setdefault(
            role, (s.value_of_css_property("background-color"), s.value_of_css_property("font-style"))
        )
    assert len(set(styles.values())) == 3, styles
    queries = [q.text for q in card.find_elements("css selector", ".searches .query")]
    assert len(queries) == 2
    hits = card.find_elements("css selector", ".searches li.hit")
    assert hits and all(h.text for h in hits)
    assert severe(browser.get_log("browser")) == []

    shot = tmp_path / "report.png"
    browser.execute_script("document.getElementById('trajectories').scrollIntoView()")
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    keep = os.environ.get("SEARCHR1_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "report.png")


def test_text_filter_and_empty_result(browser, tmp_path, tiny_tokenizer):
    run = write_run_folder(tmp_path / "run", tiny_tokenizer, steps=5, val_every=5)
    browser.get(build_report(run).resolve().as_uri())
    box = browser.find_element("id", "filter-text")
    box.send_keys("Greta")
    cards = visible_cards(browser)
    assert len(cards) == 1 and "Greta Holm" in cards[0].text
    box.send_keys(" no such words")
    assert visible_cards(browser) == []
    assert "No trajectory matches" in browser.find_element("id", "traj-list").text
    assert severe(browser.get_log("browser")) == []


def test_real_training_run_in_chromium(browser, trained_run):
    browser.get(build_report(trained_run).resolve().as_uri())
    assert severe(browser.get_log("browser")) == []
    total = len(visible_cards(browser))
    assert total == len((trained_run / "trajectories.jsonl").read_text().splitlines())
    choose(browser, "filter-step", "3")
    cards = visible_cards(browser)
    assert 0 < len(cards) < total and {c.get_attribute("data-step") for c in cards} == {"3"}
    cards[0].find_element("tag name", "summary").click()
    assert rendered(cards[0], ".transcript .seg.generated")
    assert severe(browser.get_log("browser")) == []
