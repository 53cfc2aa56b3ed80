from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from sim_study import STUDY, TARGET_S, colourful_share, is_blank, sim_study_db  # noqa: F401  (session fixture)
from test_analysis import prefix_study_db  # noqa: F401  (session fixture)

from tuner.cli import main
from tuner.plots import CAPTIONS
from tuner.report.html import render_report, write_report
from tuner.search import serve_command
from tuner.study import trial_config
from tuner.study.analysis import best_trial, open_study

pytestmark = pytest.mark.slow  # the shared simulator study takes ~10-20 s to build once

DATA_URI = re.compile(r"<img[^>]*src='data:image/png;base64,([A-Za-z0-9+/=]+)'")


def test_report_embeds_every_figure_and_writes_pngs_beside_the_study(sim_study_db):
    study = open_study(sim_study_db)
    path = write_report(study)
    assert path == sim_study_db.parent / STUDY / "report.html"  # studies/<study>/report.html
    page = path.read_text(encoding="utf-8")
    images = DATA_URI.findall(page)
    assert len(images) == len(CAPTIONS)
    for name, data in zip(CAPTIONS, images):
        png = base64.b64decode(data)
        assert not is_blank(png)
        assert (path.parent / f"{name}.png").read_bytes() == png
    # P95 TTFT against load for the best configurations, and vllm bench's per-user / per-GPU front
    assert "<figure id='ttft_by_load'>" in page and "<figure id='per_user'>" in page
    assert f"The dashed red line at {TARGET_S:g} s is the target" in page  # captions from the study's values
    assert "src='http" not in page and "<script" not in page  # self-contained
    from tuner.serving.config import Deployment

    dep = study.user_attrs["deployment"]
    command = serve_command(Deployment(**{**dep, "gpu_ids": tuple(dep["gpu_ids"])}), trial_config(best_trial(study)))
    assert command in page.replace("&#x27;", "'")
    assert "optuna-dashboard sqlite:///" in page


def test_the_answer_shows_the_repeats_that_chose_it(sim_study_db):
    from tuner.study import confirmation, confirmation_study

    study = open_study(sim_study_db)
    conf = confirmation(study)
    assert conf is not None and conf.winner == best_trial(study).number  # the fixture runs the default --confirm
    page, _ = render_report(study)
    n = len(conf.measurements[conf.winner])
    assert n >= 2
    # the same rows as the CLI's table (tuner.study.race.confirmation_rows)
    assert (f"<th class='l'>confirmed</th><td class='l'>{conf.mean:,.0f} tok/s mean of {n} "
            f"({conf.band[0]:,.0f}-{conf.band[1]:,.0f})</td>") in page
    tied = ", ".join(f"#{t}" for t in conf.ties) or "none"
    assert f"<th class='l'>tied with</th><td class='l'>{tied} (noise sd {conf.noise.rel_sd:.1%})</td>" in page
    assert html.escape(conf.reason[1:]) in page  # why this one: the decision's own words
    # the top table marks the row whose configuration was recommended
    assert f"★ marks the configuration of the recommended trial #{conf.winner}" in page and page.count(">★ ") == 1
    repeats = len(confirmation_study(study).trials)  # the companion's: the study's trials are its configurations
    assert repeats >= n - 1 and not any("confirm_of" in t.user_attrs for t in study.trials)
    assert f"{len(study.trials)} trials (" in page and f"; {repeats} confirmation repeats outside them" in page


def test_tuner_report_cli(sim_study_db, tmp_path, capsys):
    try:
        main(["report", str(sim_study_db), "--out", str(tmp_path / "out")])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, _ = capsys.readouterr()
    assert code == 0
    assert f"wrote {tmp_path / 'out' / 'report.html'}" in out
    assert all((tmp_path / "out" / f"{n}.png").is_file() for n in CAPTIONS)


def test_tuner_report_on_an_unknown_study_is_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["report", "no-such-study"])
    assert exit_.value.code == 2
    assert "no study 'no-such-study'" in capsys.readouterr().err


#: Appended to a copy of the page: on load, what the page measures, as JSON in <pre id=measure>.
_MEASURE = """<script>window.addEventListener('load', () => {
  const d = document.documentElement, top = document.querySelector('table.top');
  const box = top.getBoundingClientRect();
  const p = document.createElement('pre'); p.id = 'measure';
  const imgs = [...document.querySelectorAll('figure img')].map(
    i => ({id: i.closest('figure').id, right: i.getBoundingClientRect().right, width: i.width,
           natural: i.naturalWidth}));
  p.textContent = JSON.stringify({client: d.clientWidth, scroll: d.scrollWidth, right: box.right,
                                  table_scroll: top.scrollWidth, table_client: top.clientWidth, imgs});
  document.body.appendChild(p);
});</script>"""


def _chromium(chromium: str, profile, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.mark.parametrize("width", [1400, 800])
def test_report_opens_in_headless_chromium_and_shows_the_plots(sim_study_db, tmp_path, width):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    path = write_report(open_study(sim_study_db), tmp_path / "report")
    shot = tmp_path / f"report-{width}.png"
    run = _chromium(chromium, tmp_path / "chromium", f"--screenshot={shot}", f"--window-size={width},3000",
                    path.resolve().as_uri())
    assert shot.is_file(), f"no screenshot (exit {run.returncode}): {run.stderr[-2000:]}"
    png = shot.read_bytes()
    assert not is_blank(png)
    # the page's text is black and grey; coloured pixels come only from the figures
    assert colourful_share(png) > 0.005, "the screenshot shows no plot"
    # and the same page with its images removed has none: the colour is the figures'
    bare = tmp_path / "bare.html"
    bare.write_text(DATA_URI.sub("<img src=''", path.read_text(encoding="utf-8")), encoding="utf-8")
    shot2 = tmp_path / "bare.png"
    _chromium(chromium, tmp_path / "chromium", f"--screenshot={shot2}", f"--window-size={width},3000", bare.as_uri())
    assert colourful_share(shot2.read_bytes()) < 0.001
    # the page is no wider than the window, and the top configurations fit in it
    measured = tmp_path / "measured.html"
    measured.write_text(path.read_text(encoding="utf-8").replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    dom = _chromium(chromium, tmp_path / "chromium", f"--window-size={width},3000", "--virtual-time-budget=5000",
                    "--dump-dom", measured.as_uri()).stdout
    found = re.search(r'<pre id="measure">([^<]*)</pre>', dom)
    assert found, f"the page measured nothing: {dom[-500:]}"
    m = json.loads(html.unescape(found.group(1)))
    assert m["scroll"] <= m["client"], f"the page scrolls sideways at {width} px: {m}"
    assert m["right"] <= m["client"] and m["table_scroll"] <= m["table_client"], f"top table overflows: {m}"
    # every figure, the new ones included, is in the window whole, at its own size or scaled to fit
    assert {i["id"] for i in m["imgs"]} >= {"ttft_by_load", "per_user", "tradeoff"}
    for img in m["imgs"]:
        assert img["right"] <= m["client"], f"figure {img['id']} is cut off at {width} px: {img}"
        assert img["width"] >= min(img["natural"], m["client"]) * 0.8, f"figure {img['id']} shrunk: {img}"
    if os.environ.get("TUNER_REPORT_SHOTS"):  # keep the screenshots for a person to look at
        shutil.copy(shot, Path(os.environ["TUNER_REPORT_SHOTS"]) / shot.name)


def test_the_report_shows_failed_requests_and_no_credential(tmp_path):
    from test_analysis import _errors_study

    study = _errors_study(f"sqlite:///{tmp_path}/e.db")
    page = write_report(study, tmp_path / "out").read_text(encoding="utf-8")
    assert "<h2>Failed requests</h2>" in page and "http_429 x24, timeout x4" in page
    assert "http_429 x24</td>" in page  # the errors column beside the reason
    assert "timeout x1</td>" in page    # and in the top feasible trials
    assert "sk-old-secret" not in page and "http://***@h:8000" in page


def test_the_top_configurations_count_trials_that_differ_only_in_knobs_without_effect(prefix_study_db, tmp_path):
    page = write_report(open_study(prefix_study_db), tmp_path / "out").read_text(encoding="utf-8")
    top = page[page.index("<h2>Top feasible configurations</h2>"):page.index("<h2>Trials that did not count")
               if "<h2>Trials that did not count" in page else len(page)]
    rows = re.findall(r"<tr><td[^>]*>(★ )?(\d+)</td><td class='l'>([^<]*)</td>", top)
    assert len(rows) == 2 and [count for _, _, count in rows] == ["×4", "×4"]  # 8 trials, 2 configurations
    assert [star for star, _, _ in rows] == ["★ ", ""]  # no confirmation: the fastest is recommended
    assert "enable_prefix_caching any (no shared prefixes)" in top  # alike in both rows: said once
    assert "max_model_len any (&gt;= " in top
    assert "<th class=''>max_<wbr>num_<wbr>seqs</th>" in top  # the knob that differs keeps its column


def test_the_layout_figure_is_drawn_only_when_the_study_tried_several(prefix_study_db, sim_study_db, tmp_path):
    one = write_report(open_study(prefix_study_db), tmp_path / "one").read_text(encoding="utf-8")
    assert "<figure id='layouts'>" not in one and not (tmp_path / "one" / "layouts.png").exists()
    assert "only one layout was tried (tp1x1)" in one
    two = write_report(open_study(sim_study_db), tmp_path / "two").read_text(encoding="utf-8")
    assert "<figure id='layouts'>" in two and (tmp_path / "two" / "layouts.png").is_file()


def test_the_report_of_a_study_of_several_slos_names_them_and_colours_by_the_binding_one(tmp_path):
    from fakes import FakeBackend, small_workload
    from test_search import SPACE, fake_space

    from tuner.plots import plot_tradeoff, study_slos
    from tuner.search import run_search
    from tuner.study.analysis import trials_frame

    space = fake_space(SPACE.replace("requests: 60}", "requests: 60, slos: ['p95:e2el<=1.5s']}"))
    out = run_search(space, backend=FakeBackend(), workload=small_workload(), budget=4,
                     storage=f"sqlite:///{tmp_path}/s.db", sampler="random", seed=1, confirm=0)
    page, pngs = render_report(out.study)
    assert "target P95 TTFT ≤ 1 s, P95 E2EL ≤ 1.5 s; objective tokens (tok/s)" in page
    assert "<th class='l'>P95 E2EL</th>" in page and "(bound 1.5 s)" in page
    assert "<th class='l'>binding SLO</th><td class='l'>p95:e2el&lt;=1.5s</td>" in page
    assert "tradeoff" in pngs
    legend = plot_tradeoff(trials_frame(out.study), 1.0, slos=study_slos(out.study)).axes[0].get_legend()
    assert any(h.get_label().startswith("p95:e2el<=1.5s binds (") for h in legend.legend_handles)
