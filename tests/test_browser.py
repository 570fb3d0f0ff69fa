"""The notebooks as a person uses them: JupyterLab in headless Chromium, driven by Playwright.

A real ``jupyter lab`` starts on loopback with a token, on copies of the notebooks (so nothing is
ever saved into the repository) and with its own settings and workspace folders (no announcements,
no update check, no extension manager: the lab stays off the network). Each notebook is opened in
its own page and checked as a reader sees it: every code cell ran, no cell shows an error, every figure
is an image that loaded, every widget rendered. Every notebook but three is run there first with the
menu's *Run ▸ Run All Cells*; the three long audits (:data:`OPENED_AS_COMMITTED`: 05's power study,
07's engines, 09's kernels, three quarters of the lab's work) are checked as committed, rendered by
``make notebooks-render`` — nbval executes them in the same ``make test``, and
``tests/test_notebooks_rendered.py`` checks that their outputs come from one run.
In notebook 06 the calibrator's controls are moved (the α slider dragged with the mouse, K typed into
its readout, c stepped with the arrow keys, the hardware picked from the list and back) and after
each move the shown summary (best K), the speedup table (values, best K in bold, your K shaded) and
the plot must be the ones :mod:`specdec_lab.theory` gives for those inputs: the text and table are
computed here from the theory alone, the plot is compared pixel by pixel with the calibrator's figure
rendered here at the same inputs, and each move must change the plot (a stale figure fails).

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it; ``SPECDEC_LAB_CHROMIUM`` points
elsewhere); Playwright's own browser download is not used. ``SPECDEC_LAB_SCREENSHOTS=<dir>``
(``make browser``: ``reports/browser``) keeps a screenshot of every figure and of the calibrator
before and after the moves; otherwise they go to a temporary folder. Notebooks run two at a time
(``SPECDEC_LAB_BROWSER_PARALLEL``), each kernel on one torch thread, at ``SPECDEC_LAB_SCALE=ci``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import playwright.sync_api as playwright
import pytest

from specdec_lab import theory
from specdec_lab.experiments import speedup_calibrator, worked_example

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CHROMIUM = os.environ.get("SPECDEC_LAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [  # a closed network: without the background-networking flags Chromium's own fetches hang
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
PARALLEL = int(os.environ.get("SPECDEC_LAB_BROWSER_PARALLEL", "2"))
NOTEBOOK_TIMEOUT_S = 600  # one notebook, all cells (ci scale: 4-70 s each on 2 idle cores)
CALIBRATOR = "06_speedup_calibrator.ipynb"
EXPLORER = "00_worked_example.ipynb"  # the 3-token worked example's sliders
# Opened with their committed outputs, not run again here: ≈ 210-250 s each in the lab at ci scale against ≤ 60 s for
# any other, and nbval runs them in the same `make test` (measured in one CI run: 676 of the 901 notebook-seconds)
OPENED_AS_COMMITTED = {"05_negative_controls_and_power.ipynb", "07_auditing_engines.ipynb", "09_kernel_audit.ipynb"}
LONGEST = "03_real_models_chi_square.ipynb"  # ≈ 1 min at ci scale: the longest of those run here
K_MAX = 12  # the calibrator's table and plot span K = 0..12

# User settings of the test's lab (JUPYTERLAB_SETTINGS_DIR): every cell stays in the page (no
# windowing), nothing is autosaved, nothing is fetched from the internet.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/extensionmanager-extension/plugin": {"enabled": False},
}


# ----------------------------------------------------------------------------------- the lab


@dataclass
class Lab:
    url: str
    token: str
    log: Path

    def page_url(self, notebook: str) -> str:
        workspace = re.sub(r"\W", "-", Path(notebook).stem)  # one workspace per page: no clashes
        return f"{self.url}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={self.token}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_command(root: Path, port: int, token: str) -> list[str]:
    return [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}", "--ServerApp.terminals_enabled=False", "--ServerApp.allow_root=True",
            "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly", "--LabApp.expose_app_in_browser=True"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("lab")
    root = base / "notebooks"
    root.mkdir()
    for path in NOTEBOOKS:
        shutil.copy(path, root / path.name)
    for name, values in LAB_SETTINGS.items():
        target = base / "settings" / f"{name}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"), "JUPYTER_CONFIG_DIR": str(base / "config"),
           "JUPYTER_RUNTIME_DIR": str(base / "runtime"), "SPECDEC_LAB_SCALE": os.environ.get("SPECDEC_LAB_SCALE", "ci"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    port, token = free_port(), secrets.token_hex(16)
    log = base / "jupyter-lab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(lab_command(root, port, token), stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=base, start_new_session=True)
    server = Lab(f"http://127.0.0.1:{port}", token, log)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                with urllib.request.urlopen(f"{server.url}/api/status?token={token}", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer within 120 s:\n{server.log_tail()}")
            time.sleep(0.5)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: install Debian's chromium (apt-get install -y chromium; "
                    ".ci/run does) or set SPECDEC_LAB_CHROMIUM to a Chromium binary")
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # a laptop-wide page (figures wider than the notebook column get shrunk: the test fails below 75%),
        # tall enough that no figure's screenshot runs under the status bar
        context = browser.new_context(viewport={"width": 1400, "height": 1600})
        yield context
        context.close()
        browser.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = os.environ.get("SPECDEC_LAB_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


# ----------------------------------------------------------------------------- in the page

# The notebook panel the page shows (window.jupyterapp exists because of expose_app_in_browser).
PANEL = "window.jupyterapp && window.jupyterapp.shell.currentWidget"

KERNEL_IDLE = f"""() => {{
    const panel = {PANEL};
    const kernel = panel && panel.sessionContext && panel.sessionContext.session
                   && panel.sessionContext.session.kernel;
    return !!(kernel && kernel.status === 'idle' && panel.content.widgets.length > 0);
}}"""

# Prompts as the reader sees them: "[3]:" ran, "[*]:" queued or running, "[ ]:" not run.
PROMPTS = "() => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')).map(e => e.textContent.trim())"

# Per code cell: what the kernel sent (the model) and what the page shows (the DOM).
CELLS = f"""() => {{
    const panel = {PANEL};
    const out = [];
    panel.content.widgets.forEach((cell, index) => {{
        if (cell.model.type !== 'code') return;
        const outputs = cell.model.outputs.toJSON();
        const images = Array.from(cell.node.querySelectorAll('.jp-OutputArea-output img'));
        out.push({{
            index, count: cell.model.executionCount,
            prompt: cell.node.querySelector('.jp-InputPrompt').textContent.trim(),
            errors: outputs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
            stderr: outputs.filter(o => o.output_type === 'stream' && o.name === 'stderr')
                           .map(o => Array.isArray(o.text) ? o.text.join('') : o.text),
            model_images: outputs.filter(o => o.data && o.data['image/png']).length,
            widgets: outputs.filter(o => o.data && o.data['application/vnd.jupyter.widget-view+json']).length,
            widget_views: cell.node.querySelectorAll('.jp-OutputArea-output .jupyter-widgets').length,
            widget_failures: Array.from(cell.node.querySelectorAll('.jp-OutputArea-output'))
                                  .map(e => e.textContent).filter(t => /Error displaying widget|Loading widget/.test(t)),
            images: images.map(img => ({{loaded: img.complete && img.naturalWidth > 0,
                                          natural: img.naturalWidth, shown: img.getBoundingClientRect().width}})),
            sources: images.map(img => img.src),
        }});
    }});
    return out;
}}"""


@dataclass
class Run:
    """One notebook run in its page, and what the page showed when it finished."""

    name: str
    page: object
    started: float
    seconds: float = float("nan")
    cells: list = field(default_factory=list)
    shots: list = field(default_factory=list)

    def finished(self) -> bool:
        prompts = self.page.evaluate(PROMPTS)
        return bool(prompts) and not any("*" in p for p in prompts) and self.page.evaluate(KERNEL_IDLE)


def open_notebook(context, lab: Lab, name: str):
    page = context.new_page()
    page.goto(lab.page_url(name))
    page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=60_000)
    page.wait_for_function(KERNEL_IDLE, timeout=120_000)
    return page


def run_all_cells(page) -> None:
    """Clear the committed outputs (the notebooks are committed rendered: a stale figure or prompt must not pass
    for a fresh one), then Run ▸ Run All Cells, from the menu bar."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    page.wait_for_function("() => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt'))"
                           ".every(e => !/\\d/.test(e.textContent))", timeout=30_000)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(f"() => ({PROMPTS})().some(p => p.includes('*'))", timeout=30_000)


def run_notebooks(context, lab: Lab, names: list[str], keep: set[str], shots: Path) -> dict[str, Run]:
    """Run every notebook (those in :data:`OPENED_AS_COMMITTED`: open it as committed), ``PARALLEL`` at a time,
    each in its own page; screenshot each figure when it is done; close the pages (and shut their kernels down)
    except those in ``keep``."""
    pending, active, done = list(names), [], {}
    while pending or active:
        while pending and len(active) < PARALLEL:
            name = pending.pop(0)
            page = open_notebook(context, lab, name)
            if name not in OPENED_AS_COMMITTED:
                run_all_cells(page)
            active.append(Run(name, page, time.monotonic()))
        time.sleep(1.0)
        for run in list(active):
            if run.finished():
                run.seconds = time.monotonic() - run.started
                run.cells = settled_cells(run.page)
                run.shots = screenshot_figures(run.page, shots / Path(run.name).stem)
                active.remove(run)
                done[run.name] = run
                if run.name not in keep:
                    close(run.page)
            elif time.monotonic() - run.started > NOTEBOOK_TIMEOUT_S:
                pytest.fail(f"{run.name} still running after {NOTEBOOK_TIMEOUT_S} s; prompts: "
                            f"{run.page.evaluate(PROMPTS)}\n{lab.log_tail()}")
    return done


def settled_cells(page, timeout_s: float = 30) -> list:
    """:data:`CELLS` once the page stops changing (widgets render their outputs after the kernel is idle)."""
    def shape(cells):
        return [(len(c["images"]), all(i["loaded"] for i in c["images"]), c["widget_views"]) for c in cells]

    deadline = time.monotonic() + timeout_s
    cells = page.evaluate(CELLS)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        again = page.evaluate(CELLS)
        if shape(again) == shape(cells) and page.evaluate(WIDGET_OUTPUTS_FILLED):
            return again
        cells = again
    return cells


# Output widgets (the calibrator's) are filled by the kernel's messages after the cell has finished.
WIDGET_OUTPUTS_FILLED = """() => Array.from(document.querySelectorAll('.jp-OutputArea-output .widget-output'))
    .every(out => out.querySelector('.jp-OutputArea-output') !== null)"""


def close(page) -> None:
    """Shut the notebook's kernel down and close its page."""
    page.evaluate(f"() => {PANEL}.sessionContext.shutdown()")
    page.close()


def screenshot_figures(page, folder: Path) -> list[Path]:
    """Every figure in the page, one PNG each, at the size the reader sees."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("cell*.png"):
        old.unlink()
    paths = []
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    for i in range(cells.count()):
        images = cells.nth(i).locator(".jp-OutputArea-output img")
        for j in range(images.count()):
            path = folder / f"cell{i:02d}-figure{j}.png"
            for attempt in range(3):  # a widget's output may redraw while the page scrolls to it
                try:
                    images.nth(j).screenshot(path=path, timeout=10_000)
                    break
                except playwright.Error:
                    if attempt == 2:
                        raise
                    time.sleep(1.0)
            paths.append(path)
    return paths


def selected_notebooks(request) -> list[str]:
    """The notebooks whose tests were collected (all of them unless ``-k`` picks some)."""
    names = set()
    for item in request.session.items:
        if getattr(item, "module", None) is sys.modules[__name__]:  # doctest items have no module
            params = getattr(item, "callspec", None)
            if params and "name" in params.params:
                names.add(params.params["name"])
            else:  # a widget test: the notebook whose widget it moves
                names.add(EXPLORER if "explorer" in item.name else CALIBRATOR)
    # 06 and 00 first (their pages stay open for the widget tests), then the longest, so it does not run alone at the end
    return sorted(names, key=lambda n: (n != CALIBRATOR, n != EXPLORER, n != LONGEST, n))


@pytest.fixture(scope="module")
def runs(request, lab, browser, shots):
    started = time.monotonic()
    done = run_notebooks(browser, lab, selected_notebooks(request), keep={CALIBRATOR, EXPLORER}, shots=shots)
    timing = {name: round(run.seconds, 1) for name, run in done.items()}
    timing["all (wall)"] = round(time.monotonic() - started, 1)
    (shots / "timing.json").write_text(json.dumps(timing, indent=1))
    figures = {name: [{"cell": c["index"], "natural px": i["natural"], "shown px": round(i["shown"])}
                      for c in run.cells for i in c["images"]] for name, run in done.items()}
    (shots / "figures.json").write_text(json.dumps(figures, indent=1))
    yield done
    for run in done.values():
        if not run.page.is_closed():
            close(run.page)


# -------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_notebook_runs_in_jupyterlab(runs, name):
    run = runs[name]
    assert run.cells, f"{name}: no code cells in the page"
    errors = {c["index"]: c["errors"] for c in run.cells if c["errors"]}
    assert not errors, f"{name}: cells show errors {errors}"
    not_run = [c["index"] for c in run.cells if not re.fullmatch(r"\[\d+\]:", c["prompt"])]
    assert not not_run, f"{name}: cells {not_run} did not run (a cell above failed?)"
    for c in run.cells:
        where = f"{name}, cell {c['index']}"
        assert all(i["loaded"] for i in c["images"]), f"{where}: a figure did not load {c['images']}"
        assert len(c["images"]) >= c["model_images"], f"{where}: {c['model_images']} figures sent, " \
                                                      f"{len(c['images'])} shown"
        assert c["widget_views"] >= c["widgets"] and not c["widget_failures"], \
            f"{where}: widgets not rendered {c['widget_failures']}"
        tracebacks = [s for s in c["stderr"] if "Traceback" in s or "Error" in s]
        assert not tracebacks, f"{where}: {tracebacks}"
    assert len(run.shots) == sum(len(c["images"]) for c in run.cells)
    shrunk = {c["index"]: [round(i["shown"] / i["natural"], 2) for i in c["images"] if i["shown"] < 0.75 * i["natural"]]
              for c in run.cells}
    assert not any(shrunk.values()), f"{name}: figures shrunk below 75% to fit the page (too small to read): {shrunk}"


def test_no_figure_is_shown_twice(runs):
    """A figure returned by a cell is shown once (pyplot figures were shown twice: by the inline backend
    and as the cell's value)."""
    twice = {name: c["index"] for name, run in runs.items() for c in run.cells
             if len(set(c["sources"])) < len(c["sources"])}
    assert not twice, f"cells showing the same figure twice: {twice}"


# ------------------------------------------------------------------ the calibrator (notebook 06)

# What the calibrator's output area shows: the summary line, the table (column headings, and per row
# each cell's text and look), the figure, and each control's readout.
CALIBRATOR_STATE = """el => {
    const out = el.querySelector('.widget-output');
    const text = out.querySelector('.jp-RenderedText pre');
    const table = out.querySelector('table');
    const img = out.querySelector('img');
    const cell = td => ({text: td.textContent.trim(), weight: getComputedStyle(td).fontWeight,
                         background: getComputedStyle(td).backgroundColor});
    return {
        text: text ? text.textContent.trim() : null,
        columns: table ? Array.from(table.querySelectorAll('thead th.col_heading')).map(th => th.textContent.trim()) : [],
        rows: table ? Object.fromEntries(Array.from(table.querySelectorAll('tbody tr')).map(tr =>
            [tr.querySelector('th').textContent.trim(), Array.from(tr.querySelectorAll('td')).map(cell)])) : {},
        image: img && img.complete && img.naturalWidth > 0 ? img.src : null,
        controls: Object.fromEntries(Array.from(el.querySelectorAll('.widget-slider')).map(s =>
            [s.querySelector('.widget-label').textContent.trim(),
             {readout: s.querySelector('.widget-readout').textContent.trim(),
              disabled: s.querySelector('.noUi-target').hasAttribute('disabled')}])),
        hardware: el.querySelector('.widget-dropdown select').value,
    };
}"""


def calibrator_state(interact) -> dict:
    return interact.evaluate(CALIBRATOR_STATE)


def expected_view(alpha: float, k: int, c: float) -> dict:
    """What the calibrator must show at (α, K, c), from specdec_lab.theory alone."""
    best = theory.optimal_k(alpha, c, K_MAX)
    return {"best": best, "k": k,
            "text": (f"K = {k}: {theory.expected_tokens_per_pass(alpha, k):.2f} tokens per target pass, speedup "
                     f"{theory.expected_speedup(alpha, k, c):.2f}×. Best K = {best}: "
                     f"{theory.expected_speedup(alpha, best, c):.2f}×.\nc = {c:.4f}"),
            "columns": [str(K) for K in range(K_MAX + 1)],
            "tokens/pass": [f"{theory.expected_tokens_per_pass(alpha, K):.3f}" for K in range(K_MAX + 1)],
            "speedup ×": [f"{theory.expected_speedup(alpha, K, c):.3f}" for K in range(K_MAX + 1)]}


def reference_png(alpha: float, k: int, c: float, hardware: str) -> np.ndarray:
    """The calibrator's figure at these inputs, rendered here as the kernel's inline backend renders it."""
    import matplotlib as mpl
    import matplotlib.image
    import seaborn as sns
    from IPython.core.pylabtools import print_figure

    with mpl.rc_context():
        sns.set_theme(context="notebook", style="whitegrid")  # as the notebooks' setup()
        fig, _, _ = speedup_calibrator.calibrator_view(alpha, k, c, hardware)
        png = print_figure(fig, "png", bbox_inches="tight")
    return matplotlib.image.imread(io.BytesIO(png))


def decode_image(src: str) -> np.ndarray:
    import matplotlib.image

    assert src.startswith("data:image/png;base64,"), src[:40]
    return matplotlib.image.imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))


def wait_for_text(interact, prefix: str, timeout_s: float = 60) -> dict:
    """The calibrator's state once its summary line starts with ``prefix`` (the kernel redraws after a move)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = calibrator_state(interact)
        if state["text"] and state["text"].startswith(prefix) and state["image"] and state["rows"]:
            time.sleep(0.3)  # the figure arrives after the text: read once more when settled
            return calibrator_state(interact)
        if time.monotonic() > deadline:
            raise AssertionError(f"calibrator did not show {prefix!r} within {timeout_s} s; it shows {state['text']!r}")
        time.sleep(0.2)


def check_view(state: dict, alpha: float, k: int, c: float, hardware: str, previous: dict | None) -> None:
    want = expected_view(alpha, k, c)
    assert state["text"].startswith(want["text"]), (state["text"], want["text"])
    assert state["columns"] == want["columns"]
    for row in ("tokens/pass", "speedup ×"):
        assert [cell["text"] for cell in state["rows"][row]] == want[row], row
    bold = [K for K, cell in enumerate(state["rows"]["speedup ×"]) if int(cell["weight"]) >= 600]
    assert bold == [want["best"]], f"best K shown in bold: {bold}, theory: {want['best']}"
    shaded = [K for K, cell in enumerate(state["rows"]["speedup ×"])
              if cell["background"] not in ("rgba(0, 0, 0, 0)", "transparent", "rgb(255, 255, 255)")]
    assert k in shaded, f"your K = {k} not shaded: {shaded}"
    shown, reference = decode_image(state["image"]), reference_png(alpha, k, c, hardware)
    assert shown.shape == reference.shape and np.abs(shown - reference).mean() < 2e-3, \
        "the plot is not the speedup curve at these inputs"
    if previous is not None:
        assert state["image"] != previous["image"], "the plot did not change"


def test_calibrator_controls_give_the_theory(runs, shots):
    page = runs[CALIBRATOR].page
    interact = page.locator(".widget-interact")
    assert interact.count() == 1, "notebook 06 should show one calibrator"
    interact.scroll_into_view_if_needed()
    sliders = {name: interact.locator(".widget-slider").filter(
        has=page.locator(".widget-label", has_text=re.compile(f"^{name}$"))) for name in ("α", "K", "c")}
    before = calibrator_state(interact)
    assert before["text"] and before["image"] and before["hardware"] == "manual c", before["text"]
    interact.screenshot(path=shots / "06_calibrator_before.png")
    k, c = int(before["controls"]["K"]["readout"]), float(before["controls"]["c"]["readout"])

    # α: drag the handle a third of the track to the left, then read the value the readout shows.
    track = sliders["α"].locator(".noUi-target").bounding_box()
    handle = sliders["α"].locator(".noUi-handle").bounding_box()
    page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
    page.mouse.down()
    page.mouse.move(handle["x"] + handle["width"] / 2 - track["width"] / 3, handle["y"] + handle["height"] / 2, steps=8)
    page.mouse.up()
    alpha = float(calibrator_state(interact)["controls"]["α"]["readout"])
    assert alpha != float(before["controls"]["α"]["readout"]), "dragging the α slider did not move it"
    state = wait_for_text(interact, f"K = {k}: {theory.expected_tokens_per_pass(alpha, k):.2f} tokens")
    check_view(state, alpha, k, c, "manual c", before)

    # K: type a value into its readout.
    readout = sliders["K"].locator(".widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("9")
    page.keyboard.press("Enter")
    k = 9
    previous, state = state, wait_for_text(interact, f"K = {k}:")
    check_view(state, alpha, k, c, "manual c", previous)

    # c: focus its handle and press → four times (0.05 → 0.07 → 0.1 → 0.15 → 0.2).
    sliders["c"].locator(".noUi-handle").focus()
    for _ in range(4):
        page.keyboard.press("ArrowRight")
    c = float(calibrator_state(interact)["controls"]["c"]["readout"])
    assert c == speedup_calibrator.C_CHOICES[speedup_calibrator.C_CHOICES.index(0.05) + 4], f"→ moved c to {c}"
    previous, state = state, wait_for_text(interact, expected_view(alpha, k, c)["text"])
    check_view(state, alpha, k, c, "manual c", previous)
    assert not state["controls"]["c"]["disabled"]

    # hardware: c comes from the roofline, and the c slider is greyed out.
    interact.locator(".widget-dropdown select").select_option("h100-sxm5")
    roofline_c = theory.draft_cost_ratio("llama-70b", "llama-1b", "h100-sxm5")
    previous, state = state, wait_for_text(interact, expected_view(alpha, k, roofline_c)["text"])
    check_view(state, alpha, k, roofline_c, "h100-sxm5", previous)
    assert state["controls"]["c"]["disabled"], "the c slider should be disabled while c comes from the hardware"
    assert "roofline of llama-1b against llama-70b on h100-sxm5" in state["text"]
    interact.screenshot(path=shots / "06_calibrator_after.png")

    # ... and back to the slider's c.
    interact.locator(".widget-dropdown select").select_option("manual c")
    previous, state = state, wait_for_text(interact, expected_view(alpha, k, c)["text"])
    check_view(state, alpha, k, c, "manual c", previous)
    assert not state["controls"]["c"]["disabled"]


# ------------------------------------------------------------ the 3-token explorer (notebook 00)

EXPLORER_STATE = """el => {
    const out = el.querySelector('.widget-output');
    const text = out && out.querySelector('.jp-RenderedText pre');
    const img = out && out.querySelector('img');
    return {
        text: text ? text.textContent.trim() : null,
        image: img && img.complete && img.naturalWidth > 0 ? img.src : null,
        controls: Object.fromEntries(Array.from(el.querySelectorAll('.widget-slider')).map(s =>
            [s.querySelector('.widget-label').textContent.trim(), s.querySelector('.widget-readout').textContent.trim()])),
        rule: el.querySelector('.widget-dropdown select').value,
    };
}"""


def explorer_expected(state: dict) -> str:
    """The explorer's line at the readouts it shows, from the library alone."""
    weights = {name: float(value) for name, value in state["controls"].items()}
    p = worked_example.normalise([weights[f"p {t}"] for t in worked_example.TOKENS])
    q = worked_example.normalise([weights[f"q {t}"] for t in worked_example.TOKENS])
    return worked_example.explorer_text(p, q, state["rule"])


def wait_for_explorer(interact, want: str, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        state = interact.evaluate(EXPLORER_STATE)
        if state["text"] == want and state["image"]:
            time.sleep(0.3)  # the figure arrives after the text
            return interact.evaluate(EXPLORER_STATE)
        if time.monotonic() > deadline:
            raise AssertionError(f"explorer did not show {want!r} within {timeout_s} s; it shows {state['text']!r}")
        time.sleep(0.2)


def test_explorer_sliders_update_the_law(runs, shots):
    """Notebook 00: move p's A slider and q's C slider with the keyboard, then pick a faulty rule; after each move
    the printed output law is the library's at the readouts shown, and the picture changes."""
    page = runs[EXPLORER].page
    interact = page.locator(".widget-interact")
    assert interact.count() == 1, "notebook 00 should show one explorer"
    interact.scroll_into_view_if_needed()
    before = interact.evaluate(EXPLORER_STATE)
    assert before["text"] == explorer_expected(before) and before["image"], before["text"]
    assert "TV(out, p) = 0.000" in before["text"]
    interact.screenshot(path=shots / "00_explorer_before.png")

    def slider(name):
        return interact.locator(".widget-slider").filter(
            has=page.locator(".widget-label", has_text=re.compile(f"^{name}$")))

    state = before
    for name, presses in (("p A", 4), ("q C", -6)):
        slider(name).locator(".noUi-handle").focus()
        for _ in range(abs(presses)):
            page.keyboard.press("ArrowRight" if presses > 0 else "ArrowLeft")
        deadline = time.monotonic() + 30
        while interact.evaluate(EXPLORER_STATE)["controls"][name] == state["controls"][name]:
            assert time.monotonic() < deadline, f"the {name} slider did not move"
            time.sleep(0.2)
        time.sleep(0.5)  # continuous_update is off: the value is sent when the keys stop
        moved = interact.evaluate(EXPLORER_STATE)
        previous, state = state, wait_for_explorer(interact, explorer_expected(moved))
        assert state["text"] != previous["text"], f"moving {name} did not change the law shown"
        assert state["image"] != previous["image"], f"moving {name} did not redraw the picture"
        assert "TV(out, p) = 0.000" in state["text"], "the correct rule must give out = p at any p and q"

    interact.locator(".widget-dropdown select").select_option("residual_from_p")
    previous, state = state, wait_for_explorer(interact, explorer_expected({**state, "rule": "residual_from_p"}))
    tv = float(re.search(r"TV\(out, p\) = ([0-9.]+)", state["text"]).group(1))
    assert tv > 0.01 and state["image"] != previous["image"], state["text"]
    interact.screenshot(path=shots / "00_explorer_after.png")
