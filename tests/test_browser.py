"""A learner's session in a real browser: JupyterLab served on a copy of the course, driven
by Playwright in Debian's Chromium.

The kernels run Triton's interpreter on the CPU (COURSE_DEVICE=cpu, on any machine). The
widgets must fit the notebook's column, on a laptop screen and on a small one. Every test
saves screenshots under test-artifacts/browser/ (git-ignored) for a person to look at.
Without Chromium the tests skip and say so; `make test` installs it where apt-get works.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from course import hardware
from course.widgets import VARIANTS
from course.widgets.common import MAX_M, MAX_N, format_bytes, format_seconds, shape_values

import pytest
from grader_submissions import CH04_ROW_OFFSET  # the kernel that forgets x's row offset
from lab_server import LabServer, running_lab
from playwright.sync_api import BrowserContext, Locator, Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHAPTERS = ("ch02_roofline", "ch04_fused", "ch07_backward")
RELEASE_CH04 = "notebooks/ch04_fused/ch04_fused.ipynb"
SOURCE_CH04 = "solutions/ch04_fused/ch04_fused.ipynb"
RELEASE_CH02 = "notebooks/ch02_roofline/ch02_roofline.ipynb"
RIDGE_ANSWER = """def ridge_point(peak_flops, bytes_per_s):
    return peak_flops / bytes_per_s


def regime(intensity, peak_flops, bytes_per_s):
    return "memory" if intensity < ridge_point(peak_flops, bytes_per_s) else "compute"
"""
RELEASE_CH07 = "notebooks/ch07_backward/ch07_backward.ipynb"

CHROMIUM = shutil.which("chromium")  # Debian's; Ubuntu's chromium-browser is a snap stub
# Headless, no sandbox (root in a container), and nothing that calls out: the network may
# be closed, and a browser waiting on it makes a test slow or flaky.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 900}   # a laptop screen, file browser open
# A small laptop screen: the notebook's column is narrower than the widgets' widest rows.
NARROW_VIEWPORT = {"width": 1024, "height": 900}
CELL_TIMEOUT_S = 180     # the interpreter on a busy 2-core machine
STALLED_S = 10           # the kernel idle this long, and the cell still not run: it won't be

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason=(
        "needs Chromium on PATH (Debian: apt-get install chromium; `make test` installs it "
        "where apt-get can)")),
]

ROW_OFFSET_ADVICE = "Row 0 is right but the other rows are wrong"
# The access picture's caption for that kernel (course.access_picture).
ROW_OFFSET_PICTURE = "every program read row 0 of x: the load's row offset is missing"


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    return ARTIFACTS


@pytest.fixture(scope="module")
def lab() -> Iterator[LabServer]:
    with tempfile.TemporaryDirectory(prefix="course-browser-") as tmp:
        course_copy = Path(tmp) / "course"
        for side in ("notebooks", "solutions"):
            for chapter in CHAPTERS:
                shutil.copytree(ROOT / side / chapter, course_copy / side / chapter)
        with running_lab(course_copy, Path(tmp) / "lab", env={"COURSE_DEVICE": "cpu"}) as server:
            yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[BrowserContext]:
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport=VIEWPORT)
        context.set_default_timeout(60_000)
        # Assertions wait as long as actions: on 2 busy cores JupyterLab once took more
        # than expect's default 5 s to show a notebook's first cell.
        expect.set_options(timeout=60_000)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def open_notebook(lab, browser, artifacts, request):
    """open_notebook(path) -> a page showing it. Each page's last state is saved as
    <test name>-end-<n>.png, and the server's log printed (pytest shows it on a failure)."""
    pages: list[Page] = []

    def open_(path: str, viewport: dict[str, int] = VIEWPORT) -> Page:
        page = browser.new_page()
        page.set_viewport_size(viewport)
        pages.append(page)
        page.goto(lab.notebook_url(path, workspace=f"{request.node.name}-{len(pages)}"))
        expect(page.locator(".jp-NotebookPanel .jp-Cell").first).to_be_visible()
        # The kernel is ready when the page is connected to it and says it is idle.
        lab.wait_for_kernel_connection(path)
        expect(kernel_status(page)).to_have_text(re.compile(r"\| Idle$"))
        return page

    yield open_
    for number, page in enumerate(pages):
        page.screenshot(path=artifacts / f"{request.node.name}-end-{number}.png")
        page.close()
    print(f"JupyterLab's log:\n{lab.log_tail()}")


# ---------------------------------------------------------------- driving the notebook


def kernel_status(page: Page) -> Locator:
    """The status bar's "Python 3 (ipykernel) | Idle" (or Busy, Starting, ...)."""
    return page.locator(".jp-StatusBar-Item").filter(has_text="(ipykernel) |")


def cell_with(page: Page, source: str) -> Locator:
    """The one cell whose source contains `source`."""
    cell = page.locator(".jp-Notebook .jp-Cell").filter(
        has=page.locator(".jp-InputArea-editor", has_text=source))
    expect(cell).to_have_count(1)
    return cell


def prompt(cell: Locator) -> str:
    return cell.locator(".jp-InputPrompt").inner_text().strip()


def wait_until_run(page: Page, cell: Locator, before: str) -> None:
    """Wait for the cell's prompt to show a new execution count: the cell has run. Fail
    early when the kernel sits idle and the cell is neither run nor queued ("[*]:"): a
    cell above failed, or the keystroke never reached the notebook."""
    deadline = time.monotonic() + CELL_TIMEOUT_S
    idle_since = None
    while True:
        shown = prompt(cell)
        if shown != before and re.fullmatch(r"\[\d+\]:", shown):
            return
        if shown != "[*]:" and kernel_status(page).inner_text().endswith("| Idle"):
            idle_since = idle_since or time.monotonic()
        else:
            idle_since = None
        stalled = idle_since is not None and time.monotonic() - idle_since > STALLED_S
        if stalled or time.monotonic() > deadline:
            raise AssertionError(f"the cell did not run (its prompt reads {shown!r}):\n"
                                 f"{cell.inner_text()[:500]}\n{tracebacks(page)}")
        page.wait_for_timeout(250)


def run_cell(page: Page, cell: Locator) -> None:
    """Select the cell as a learner does (click its prompt) and press Shift+Enter."""
    before = prompt(cell)
    cell.locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")
    wait_until_run(page, cell, before)


def run_all_above(page: Page, cell: Locator, last_above: Locator) -> None:
    """Run > Run All Above Selected Cell, then wait for `last_above` (the last code cell
    above) to finish: the kernel runs the cells in order."""
    before = prompt(last_above)
    cell.locator(".jp-InputPrompt").click()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Above Selected Cell").click()
    wait_until_run(page, last_above, before)


def replace_source(page: Page, cell: Locator, source: str) -> None:
    """Select the cell's text and paste `source` over it, as a learner would."""
    cell.locator(".jp-InputArea-editor .cm-content").click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.insert_text(source)
    # Each editor line is an element of its own, so an empty line reads as two newlines:
    # compare the lines with text (the editor must not have re-indented or closed brackets).
    shown = cell.locator(".jp-InputArea-editor .cm-content").inner_text()
    assert non_blank_lines(shown) == non_blank_lines(source), f"the editor holds:\n{shown}"


def non_blank_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def output_text(cell: Locator) -> str:
    return cell.locator(".jp-OutputArea").inner_text()


def tracebacks(page: Page) -> str:
    """The text of every output that shows a traceback, one after another."""
    failed = page.locator(".jp-OutputArea-output", has_text="Traceback")
    return "\n---\n".join(failed.all_inner_texts())


def assert_no_tracebacks(page: Page) -> None:
    failed = tracebacks(page)
    assert not failed, f"a cell failed:\n{failed}"


# ipywidgets writes the spaces of an option's label as no-break spaces.
SHOWN_CHOICE = ("s => s.selectedIndex < 0 ? ''"
                " : s.options[s.selectedIndex].textContent.replace(/\\u00a0/g, ' ')")


def assert_every_dropdown_shows_a_choice(cell: Locator) -> None:
    """An empty dropdown is what ipywidgets shows for a value it reads as "nothing
    selected" (None): the learner cannot tell what the widget computes with."""
    shown = cell.locator(".jp-OutputArea select").evaluate_all(
        f"selects => selects.map({SHOWN_CHOICE})")
    assert shown and all(shown), f"dropdowns show {shown}"


def assert_fits_its_output_area(cell: Locator) -> None:
    """Nothing in the output is wider than the output area: no clipping, no sideways
    scrolling inside the notebook."""
    widths = cell.locator(".jp-OutputArea-output").first.evaluate(
        "area => ({area: area.clientWidth, content: area.scrollWidth,"
        " widest: Math.max(...[...area.querySelectorAll('*')].map("
        "  e => e.getBoundingClientRect().right)) - area.getBoundingClientRect().left})")
    # A pixel of slack for rounding of fractional widths.
    assert widths["content"] <= widths["area"] and widths["widest"] <= widths["area"] + 1, widths


def assert_laid_out_and_save(cell: Locator, screenshot: Path) -> None:
    """The checks every widget's output gets, then its picture for a person to look at."""
    assert_fits_its_output_area(cell)
    assert_every_dropdown_shows_a_choice(cell)
    cell.locator(".jp-OutputArea").screenshot(path=screenshot)


def assert_legible_at_1024_px(page: Page, cell: Locator, screenshot: Path) -> None:
    """On a 1024-pixel-wide screen, every access picture in the cell's output fits the
    output area and is shown at 80 % of its drawn size or more (its numbers stay readable).
    Save the screen with the first picture at its bottom, what came before above it."""
    page.set_viewport_size(NARROW_VIEWPORT)
    try:
        pictures = cell.locator(".course-access-picture")
        for picture in pictures.all():
            shown, drawn, right, edge = picture.evaluate(
                "p => [p.querySelector('img').clientWidth, p.querySelector('img').naturalWidth,"
                " p.querySelector('img').getBoundingClientRect().right,"
                " p.closest('.jp-OutputArea-output').getBoundingClientRect().right]")
            assert shown >= 0.8 * drawn and right <= edge + 1, (shown, drawn, right, edge)
        pictures.first.evaluate("p => p.scrollIntoView({block: 'end'})")
        page.screenshot(path=screenshot)
    finally:
        page.set_viewport_size(VIEWPORT)


# ---------------------------------------------------------------- the traffic calculator


def slider(calculator: Locator, label: str) -> Locator:
    return calculator.locator(".widget-hslider").filter(has_text=label)


def dropdown_choice(widget: Locator, label: str) -> str:
    """What the dropdown labelled `label` shows ("" when nothing is selected)."""
    select = widget.locator(".widget-dropdown").filter(has_text=label).locator("select")
    return select.evaluate(SHOWN_CHOICE)


def expected_lines(M: int, N: int, dtype: str, gpu: str,
                   name: str = "fused_rmsnorm") -> list[str]:
    """What the calculator for `name` must show at this setting, from course.traffic and
    course.hardware as the widget computes it (default options, weight in x's dtype)."""
    variant = VARIANTS[name]
    model = variant.model(M, N, dtype, None, **variant.options)
    spec = hardware.lookup(gpu)
    return [f"{model.variant} at M = {M}, N = {N}: {format_bytes(model.bytes)} in "
            f"{model.launches} launch(es)",
            f"predicted at the {spec.name}'s peak HBM bandwidth ({spec.hbm_gbps:.0f} GB/s): "
            f"{format_seconds(model.predicted_time(spec.hbm_bytes_per_s))}"]


def move_slider(page: Page, calculator: Locator, label: str, key: str, want: int) -> None:
    """Focus the slider's handle and press an arrow key, as a keyboard user does."""
    control = slider(calculator, label)
    control.locator(".noUi-handle").focus()
    page.keyboard.press(key)
    expect(control.locator(".widget-readout")).to_have_text(str(want))


# ---------------------------------------------------------------- the tests


def test_release_notebook_explains_a_wrong_kernel_and_its_calculator_follows_the_sliders(
        open_notebook, artifacts):
    page = open_notebook(RELEASE_CH04)

    setup = cell_with(page, "print(course.banner())")
    run_cell(page, setup)
    assert output_text(setup).startswith(
        "course: no GPU visible, kernels run in Triton's interpreter on the CPU")
    page.screenshot(path=artifacts / "ch04-release-1-setup.png")

    # The learner writes a kernel with a bug, runs everything before it, then looks at what
    # it touches (course.show_accesses, the cell after the exercise), then runs the check.
    exercise = cell_with(page, "def rmsnorm_kernel(")
    replace_source(page, exercise, CH04_ROW_OFFSET)
    run_all_above(page, exercise, last_above=cell_with(page, "LENGTHS = ("))
    run_cell(page, exercise)
    assert_no_tracebacks(page)
    accesses_cell = cell_with(page, "course.show_accesses(rmsnorm, x_small")
    run_cell(page, accesses_cell)
    assert_no_tracebacks(page)
    picture = accesses_cell.locator(".course-access-picture")
    expect(picture.locator("img")).to_be_visible()
    expect(picture).to_contain_text(ROW_OFFSET_PICTURE)
    assert_legible_at_1024_px(page, accesses_cell, artifacts / "ch04-release-2-show-accesses.png")

    check = cell_with(page, "check.rmsnorm_forward(rmsnorm)")
    run_cell(page, check)
    diagnosis = output_text(check)
    assert "rmsnorm_forward check failed" in diagnosis, diagnosis
    assert ROW_OFFSET_ADVICE in diagnosis, diagnosis
    assert re.search(r"rows 1\.\.\d+ of 0\.\.\d+", diagnosis), diagnosis
    check.locator(".jp-OutputArea").scroll_into_view_if_needed()
    page.screenshot(path=artifacts / "ch04-release-3-wrong-kernel-diagnosis.png")
    # Under the failed check's message: the picture of the learner's kernel on a smaller
    # run of the failing case, then a correct kernel's on the same input.
    pictures = check.locator(".course-access-picture")
    expect(pictures).to_have_count(2)
    expect(pictures.first).to_contain_text(ROW_OFFSET_PICTURE)
    expect(pictures.nth(1)).to_contain_text("A correct kernel on the same input: each program "
                                            "p read row p and wrote row p")
    message = check.locator(".jp-OutputArea-output", has_text="rmsnorm_forward check failed")
    assert message.bounding_box()["y"] < pictures.first.bounding_box()["y"]
    for number in range(2):
        expect(pictures.nth(number).locator("img")).to_be_visible()
    assert_legible_at_1024_px(page, check, artifacts / "ch04-release-4-check-picture.png")

    calculator_cell = cell_with(page, 'widgets.traffic_calculator("fused_rmsnorm"')
    run_cell(page, calculator_cell)
    calculator = calculator_cell.locator(".jp-OutputArea")
    expect(slider(calculator, "N (row)")).to_be_visible()
    dtype, gpu = dropdown_choice(calculator, "dtype"), dropdown_choice(calculator, "GPU")
    assert dropdown_choice(calculator, "weight") == "same as x"
    M = int(slider(calculator, "M (rows)").locator(".widget-readout").inner_text())
    N = int(slider(calculator, "N (row)").locator(".widget-readout").inner_text())
    for line in expected_lines(M, N, dtype, gpu):
        expect(calculator).to_contain_text(line)
    assert_laid_out_and_save(calculator_cell, artifacts / "ch04-release-5-calculator.png")

    # One step right on N, one step left on M: the next and previous slider values.
    n_values, m_values = shape_values(MAX_N, N), shape_values(MAX_M, M)
    new_N, new_M = n_values[n_values.index(N) + 1], m_values[m_values.index(M) - 1]
    before = calculator.inner_text()
    move_slider(page, calculator, "N (row)", "ArrowRight", new_N)
    move_slider(page, calculator, "M (rows)", "ArrowLeft", new_M)
    for line in expected_lines(new_M, new_N, dtype, gpu):
        expect(calculator).to_contain_text(line)
    for line in expected_lines(M, N, dtype, gpu):
        assert line not in calculator.inner_text(), f"still showing {line!r}"
    assert calculator.inner_text() != before
    calculator.screenshot(path=artifacts / "ch04-release-6-calculator-moved.png")


def test_source_notebook_runs_to_its_calculator_and_its_solution_passes(open_notebook,
                                                                         artifacts):
    page = open_notebook(SOURCE_CH04)
    calculator_cell = cell_with(page, 'widgets.traffic_calculator("fused_rmsnorm"')
    run_all_above(page, calculator_cell, last_above=cell_with(page, "LATENCY_S = "))
    assert_no_tracebacks(page)

    report = output_text(cell_with(page, "check.rmsnorm_forward(rmsnorm)\n"))
    passed = re.search(r"rmsnorm_forward: (\d+)/(\d+) cases pass", report)
    assert passed and passed.group(1) == passed.group(2), report

    visualiser = cell_with(page, "widgets.reduction_visualiser()")
    expect(visualiser.locator(".jp-OutputArea img")).to_be_visible()
    assert_laid_out_and_save(visualiser, artifacts / "ch04-source-1-reduction-visualiser.png")

    run_cell(page, calculator_cell)
    calculator = calculator_cell.locator(".jp-OutputArea")
    expect(calculator).to_contain_text("measuring needs a GPU")
    assert_laid_out_and_save(calculator_cell, artifacts / "ch04-source-2-calculator.png")


def test_chapter_02_widgets_fit_a_small_screen(open_notebook, artifacts):
    page = open_notebook(RELEASE_CH02, viewport=NARROW_VIEWPORT)
    # Exercise 2a (the ridge point) lies above: answered first, as a learner would
    replace_source(page, cell_with(page, "def ridge_point("), RIDGE_ANSWER)
    explorer_cell = cell_with(page, "widgets.roofline_explorer()")
    run_all_above(page, explorer_cell, last_above=cell_with(page, "times = {}"))
    assert_no_tracebacks(page)
    plot_cell = cell_with(page, "fig, ax = plt.subplots(")
    plot_cell.locator(".jp-OutputArea").screenshot(path=artifacts / "ch02-release-1-roofline.png")

    run_cell(page, explorer_cell)
    explorer = explorer_cell.locator(".jp-OutputArea")
    expect(explorer.locator("img")).to_be_visible()
    assert_laid_out_and_save(explorer_cell, artifacts / "ch02-release-2-roofline-explorer.png")

    calculator_cell = cell_with(page, 'widgets.traffic_calculator("fused_rmsnorm")')
    run_cell(page, calculator_cell)
    calculator = calculator_cell.locator(".jp-OutputArea")
    expect(calculator).to_contain_text("measuring needs a GPU")
    assert_laid_out_and_save(calculator_cell, artifacts / "ch02-release-3-calculator.png")


def test_chapter_07_layernorm_backward_calculator_follows_its_sliders(open_notebook, artifacts):
    """The calculator for LayerNorm's backward (new with chapter 07's LayerNorm exercise):
    its model's bytes, and a step of its N slider, on a small screen. It needs only the
    chapter's set-up cells, not the kernels above it."""
    page = open_notebook(RELEASE_CH07, viewport=NARROW_VIEWPORT)
    for source in ("print(course.banner())", "from course import widgets"):
        run_cell(page, cell_with(page, source))
    calculator_cell = cell_with(page, 'widgets.traffic_calculator("layernorm_backward")')
    run_cell(page, calculator_cell)
    assert_no_tracebacks(page)
    calculator = calculator_cell.locator(".jp-OutputArea")
    expect(calculator).to_contain_text("LayerNorm backward (dX, dW, dB)")
    dtype, gpu = dropdown_choice(calculator, "dtype"), dropdown_choice(calculator, "GPU")
    M = int(slider(calculator, "M (rows)").locator(".widget-readout").inner_text())
    N = int(slider(calculator, "N (row)").locator(".widget-readout").inner_text())
    for line in expected_lines(M, N, dtype, gpu, "layernorm_backward"):
        expect(calculator).to_contain_text(line)
    assert_laid_out_and_save(calculator_cell, artifacts / "ch07-release-1-ln-calculator.png")

    n_values = shape_values(MAX_N, N)
    new_N = n_values[n_values.index(N) + 1]
    move_slider(page, calculator, "N (row)", "ArrowRight", new_N)
    for line in expected_lines(M, new_N, dtype, gpu, "layernorm_backward"):
        expect(calculator).to_contain_text(line)
