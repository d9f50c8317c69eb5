"""runs/<name>/report.html: what it embeds, that it is replaced atomically, and, in headless
Chromium, that it renders, that its charts have data and that its filters work when used."""

from __future__ import annotations

import http.client
import json
import math
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from areal_agents.config import dump_yaml, load_config
from areal_agents.trainers.config import TrainConfig
from areal_agents.trainers.report import refresh_report, render_report, tool_metrics, write_report

STATUSES = ("answered", "max_turns")


def make_run(root: Path, steps: int = 6, heldout: bool = True) -> Path:
    """A run directory as the trainer leaves it after ``steps`` steps (2 transcripts each)."""
    run = root / "calculator-grpo"
    run.mkdir(parents=True)
    dump_yaml(load_config(TrainConfig, ["env=calculator", "model=tiny"]), run / "config.yaml")
    rows, elapsed = [], 0.0
    for step in range(1, steps + 1):
        wait, train, push = 2.0 + step, 1.5, 0.25
        elapsed += wait + train + push
        row: dict[str, Any] = {
            "step": step,
            "reward/mean": step / steps,
            "reward/max": 1.0,
            "throughput/tokens_per_s": 10.0 * step,
            "staleness/max": step % 2,
            "staleness/mean": (step % 2) / 2,
            "time/wait_s": wait,
            "time/train_s": train,
            "time/sync_s": push,
            "time/step_s": wait + train + push,
            "time/elapsed_s": elapsed,
            **tool_metrics([{"tool_calls": 2, "tool_errors": {"parse": step % 2}}]),
            "loss/policy": math.nan if step == 2 else 0.1,
            "batch/traj_ids": [f"{step}-0", f"{step}-1"],
        }
        if heldout and step in (1, steps):
            row["eval/success"] = 0.25 if step == 1 else 0.75
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    transcripts = [
        {
            "step": step,
            "traj_id": f"{step}-{k}",
            "task_id": f"calc-{step}x{k}",
            "reward": float(k),
            "terminated": bool(k),
            "truncated": not k,
            "num_turns": 2,
            "tool_calls": 1,
            "tool_errors": {"parse": 1 - k},
            "messages": [
                {"role": "user", "content": f"What is {step} + {k}?"},
                {"role": "assistant", "content": f"\\boxed{{{step + k}}}" if k else "hmm"},
            ],
            "info": {"outcome": STATUSES[1 - k], "reward_details": {}},
        }
        for step in range(1, steps + 1)
        for k in (0, 1)
    ]
    (run / "transcripts.jsonl").write_text("".join(json.dumps(t) + "\n" for t in transcripts))
    return run


def embedded(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)
    assert match, "the report carries no run data"
    return json.loads(match.group(1))  # type: ignore[no-any-return]


def test_tool_metrics_by_hand() -> None:
    episodes = [
        {"tool_calls": 3, "tool_errors": {"parse": 1, "invalid_arguments": 1, "tool_failure": 0}},
        {"tool_calls": 1, "tool_errors": {"parse": 0, "unknown_tool": 1}},
    ]
    figures = tool_metrics(episodes)
    # attempts: 4 calls run + 1 unparseable = 5; errors: 1 + 1 + 1 = 3
    assert figures == {
        "tools/calls_per_episode": 2.0,
        "tools/error_rate": 3 / 5,
        "tools/error_rate/invalid_arguments": 1 / 5,
        "tools/error_rate/parse": 1 / 5,
        "tools/error_rate/unknown_tool": 1 / 5,
    }
    assert tool_metrics([{"tool_calls": 0, "tool_errors": {}}])["tools/error_rate"] == 0.0


def test_the_report_embeds_curves_configuration_and_transcripts(tmp_path: Path) -> None:
    run = make_run(tmp_path, steps=4)
    page = render_report(run, max_transcripts=5)
    data = embedded(page)
    assert [r["step"] for r in data["metrics"]] == [1, 2, 3, 4]
    assert data["metrics"][1]["loss/policy"] is None  # NaN: a gap, and valid JSON
    assert "batch/traj_ids" not in data["metrics"][0]  # lists stay in metrics.jsonl
    assert data["config"]["env.name"] == "calculator" and data["config"]["model.name"] == "tiny"
    assert data["finished"] is False and data["summary"] == {}
    assert (data["transcripts"], data["transcripts_shown"]) == (8, 5)
    assert page.count('"traj_id"') == 5 and '"traj_id": "4-1"' in page  # the latest five
    assert "<title>areal_agents eval transcripts</title>" in page  # the viewer, retitled in JS
    # nothing to fetch (the only URL is the SVG namespace's name): it works offline
    assert not re.search(r"""(src|href|url)\s*[=(]\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "import(" not in page
    # once summary.json says the run ended at the last recorded step, the page says so
    (run / "summary.json").write_text(
        json.dumps({"finished": True, "steps": 4, "stop_reason": "total_steps", "run_dir": "x"})
    )
    data = embedded(render_report(run))
    assert data["finished"] is True and data["summary"]["stop_reason"] == "total_steps"
    assert "run_dir" not in data["summary"]


def test_the_report_is_replaced_atomically_while_read(tmp_path: Path) -> None:
    run = make_run(tmp_path, steps=30)
    write_report(run)
    stop = threading.Event()
    torn: list[int] = []

    def rewrite() -> None:
        while not stop.is_set():
            write_report(run)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        for _ in range(200):
            text = (run / "report.html").read_text()
            if not text.rstrip().endswith("</html>"):
                torn.append(len(text))
            else:
                assert len(embedded(text)["metrics"]) == 30
    finally:
        stop.set()
        writer.join()
    assert not torn, f"{len(torn)} reads saw a partial file"
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".report-")) == []


def test_refreshing_never_fails_a_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert refresh_report(tmp_path / "missing") is None
    assert "could not write" in caplog.text
    empty = tmp_path / "fresh"
    empty.mkdir()
    assert refresh_report(empty) == empty / "report.html"  # a run before its first step


# ---- headless Chromium ----------------------------------------------------------------------

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


def dump_dom(page: Path, fragment: str, profile: Path) -> str:
    chromium = shutil.which("chromium") or "chromium"
    command = [chromium, *FLAGS, f"--user-data-dir={profile}", "--dump-dom"]
    done = subprocess.run(
        [*command, page.as_uri() + fragment], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def chart_points(dom: str) -> dict[str, int]:
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r'<div class="chart" id="chart-(\w+)" data-points="(\d+)"', dom)
    }


@pytest.mark.browser
def test_the_report_renders_with_data_in_headless_chromium(tmp_path: Path) -> None:
    page = write_report(make_run(tmp_path, steps=6))
    dom = dump_dom(page, "", tmp_path / "p1")
    points = chart_points(dom)
    assert points == {
        "reward": 12,  # mean and max at 6 steps
        "heldout": 2,  # measured at the first and last step only
        "throughput": 6,
        "staleness": 12,
        "idle": 6,
        "tools": 9,  # all errors at 6 steps, parse errors at the 3 odd ones
        "time": 18,  # three stacked parts at 6 steps
        "episodes": 6,  # tool calls per episode (this run logs no turns)
        "policy": 0,  # policy movement, importance weights, clipped fractions: not logged
        "weights": 0,
        "fractions": 0,
    }
    assert dom.count("<polyline") == 10 and dom.count("<rect") == 18  # 2+1+1+1+2+1+2 lines
    assert "Run report: calculator-grpo" in dom and 'class="badge running"' in dom
    assert "6 steps" in dom and "last reward 1" in dom
    assert '<td>env.name</td><td>"calculator"</td>' in dom  # the configuration
    assert "showing 12 of 12" in dom and dom.count('class="episode pass"') == 6
    assert '<option value="max_turns">max_turns</option>' in dom  # statuses found in the data
    assert 'id="step-filter"' in dom and 'id="step-filter" hidden' not in dom
    # filters and the x axis preset in the fragment, as a reload after a change keeps them
    dom = dump_dom(page, "#stepmin=2&stepmax=3&status=max_turns&x=time", tmp_path / "p2")
    assert "showing 2 of 12" in dom and 'class="episode pass"' not in dom
    assert re.findall(r"<strong>step (\d) ", dom) == ["2", "3"]
    assert 'data-xaxis="time"' in dom and "elapsed time (s)" in dom
    dom = dump_dom(write_report(make_run(tmp_path / "b", heldout=False)), "", tmp_path / "p3")
    assert chart_points(dom)["heldout"] == 0 and "not measured in this run" in dom


def all_of(selector: str, value: str) -> str:
    """Script: ``value`` (an expression of ``e``) for every element matching ``selector``."""
    return f"[...document.querySelectorAll({selector!r})].map((e) => {value})"


class DevTools:
    """Just enough of the Chrome DevTools protocol to load a page and run script in it."""

    def __init__(self, profile: Path) -> None:
        from websockets.sync.client import connect

        chromium = shutil.which("chromium") or "chromium"
        self.proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.is_file() and active.read_text().strip()):
            assert time.monotonic() < deadline, "chromium did not open its debugging port"
            time.sleep(0.1)
        port = int(active.read_text().split()[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/json/list")
        targets = json.loads(conn.getresponse().read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None).__enter__()
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        self.call("Page.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message.get("result", {})  # type: ignore[no-any-return]
            self.events.append(message)

    def wait_event(self, name: str) -> None:
        deadline = time.monotonic() + 60
        while not any(e.get("method") == name for e in self.events):
            assert time.monotonic() < deadline, f"no {name}"
            self.events.append(json.loads(self.ws.recv(timeout=60)))
        self.events.clear()

    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.mark.browser
def test_the_filters_and_the_axis_work_when_used(tmp_path: Path) -> None:
    page = write_report(make_run(tmp_path, steps=6))
    browser = DevTools(tmp_path / "cdp")
    try:
        browser.open(page.as_uri() + "#refresh=0")
        shown = "Number(document.body.dataset.shown)"

        def set_control(element_id: str, value: str) -> None:  # what typing or choosing does
            browser.js(
                f"(() => {{ const e = document.getElementById({element_id!r}); "
                f"e.value = {value!r}; e.dispatchEvent(new Event('input')); "
                f"e.dispatchEvent(new Event('change')); }})()"
            )

        assert browser.js(shown) == 12
        set_control("status", "answered")
        assert browser.js(shown) == 6
        set_control("stepmin", "5")
        assert browser.js(shown) == 2
        assert browser.js(all_of("#episodes strong", "e.textContent")) == [
            "step 5 · 5-1 · calc-5x1",
            "step 6 · 6-1 · calc-6x1",
        ]
        set_control("stepmin", "")
        set_control("min", "0.5")
        set_control("status", "all")
        assert browser.js(shown) == 6  # reward >= 0.5: the six passes
        set_control("outcome", "fail")
        assert browser.js(shown) == 0
        set_control("outcome", "all")
        set_control("task", "calc-3")
        assert browser.js(shown) == 1
        # the x axis: clicking "elapsed time" redraws every chart over time
        assert browser.js("document.getElementById('charts').dataset.xaxis") == "step"
        browser.js("document.querySelector('input[name=xaxis][value=time]').click()")
        assert browser.js("document.getElementById('charts').dataset.xaxis") == "time"
        labels = browser.js(all_of("#chart-reward svg text", "e.textContent"))
        assert "elapsed time (s)" in labels
        points = browser.js(all_of(".chart", "Number(e.dataset.points)"))
        assert points == [12, 2, 6, 6, 12, 6, 9, 0, 0, 0, 18]  # the same data, other axis
        # a reload (what the running page does every 30 s) keeps the filters and the axis
        assert "task=calc-3" in browser.js("location.hash")
        browser.call("Page.reload")
        browser.wait_event("Page.loadEventFired")
        assert browser.js(shown) == 1
        assert browser.js("document.getElementById('charts').dataset.xaxis") == "time"
    finally:
        browser.close()
