"""sqlrl's console page (``deploy/monitoring/consoles/sqlrl.html``): its panels, and a render of it
in headless Chromium.

- ``panels()`` reads the panels from the template itself: group, title and the PromQL of each
  curve. Tests and docs use this list, so they check the page that is shipped, not a copy of it.
- ``screenshot(settings, out, range, size)`` loads ``/consoles/sqlrl.html`` from the running
  Prometheus with the graphs' time range set to ``range``. It writes a PNG of the window
  (``--screenshot``), then loads the page again and reads the DOM its scripts built
  (``--dump-dom``). Chromium's ``--virtual-time-budget`` holds both until the page's queries have
  answered and its timers have run: they wait on the page's events, not on a fixed sleep.
  ``PageReport`` says, per panel, whether it drew a chart, answered "No timeseries returned", or
  failed to load. Chromium runs with a throwaway profile, in a session of its own that is killed
  if it overruns ``timeout_s``.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from jobs.monitor import CONSOLE_PAGE, CONSOLES, MonitorError, Settings

TEMPLATE = CONSOLES / "sqlrl.html"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Panel:
    group: str
    title: str
    exprs: tuple[str, ...]
    state: str = "template"  # after a render: chart | empty | error | loading


@dataclass(frozen=True)
class PageReport:
    png: Path
    panels: tuple[Panel, ...]

    @property
    def rendered(self) -> bool:
        """At least one chart drawn and no panel that failed or is still loading."""
        return (any(p.state == "chart" for p in self.panels)
                and not any(p.state in ("error", "loading") for p in self.panels))

    def groups(self, state: str = "chart") -> set[str]:
        return {p.group for p in self.panels if p.state == state}

    def describe(self) -> str:
        lines = [f"screenshot: {self.png}"]
        for group in dict.fromkeys(p.group for p in self.panels):
            states = [f"{p.title}: {p.state}" for p in self.panels if p.group == group]
            lines.append(f"  {group:8s} " + "; ".join(states))
        return "\n".join(lines)


class _PanelParser(html.parser.HTMLParser):
    """Collects every ``div.sqlrl-panel``: its group, title (``h5``), queries (``code.sqlrl-q``) and
    what the page drew in it (an ``svg`` chart, a ``.prom_graph_error`` text, a loading image)."""

    def __init__(self) -> None:
        super().__init__()
        self.panels: list[dict] = []
        self._depth = 0  # div nesting inside the current panel
        self._field: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "div" and "sqlrl-panel" in classes and not self._depth:
            self.panels.append({"group": a.get("data-group", ""), "title": "", "exprs": [], "svg": False,
                                "error": "", "loading": False})
            self._depth = 1
            return
        if not self._depth:
            return
        p = self.panels[-1]
        if tag == "div":
            self._depth += 1
            if "prom_graph_error" in classes:
                self._field = "error"
        elif tag == "h5":
            self._field = "title"
        elif tag == "code" and "sqlrl-q" in classes:
            p["exprs"].append("")
            self._field = "expr"
        elif tag == "svg":
            p["svg"] = True
        elif tag == "img" and "prom_graph_loading" in classes:
            p["loading"] = True

    def handle_endtag(self, tag: str) -> None:
        if not self._depth:
            return
        if tag in ("h5", "code") or (tag == "div" and self._field == "error"):
            self._field = None
        if tag == "div":
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if not self._depth or not self._field:
            return
        p = self.panels[-1]
        if self._field == "expr":
            p["exprs"][-1] += data
        else:
            p[self._field] += data


def _parse(text: str) -> list[Panel]:
    parser = _PanelParser()
    parser.feed(text)
    out = []
    for p in parser.panels:
        error = p["error"].strip()
        state = ("error" if error and "No timeseries" not in error else "empty" if error else
                 "chart" if p["svg"] else "loading" if p["loading"] else "template")
        exprs = tuple(" ".join(e.split()) for e in p["exprs"])
        out.append(Panel(p["group"], " ".join(p["title"].split()), exprs, state))
    return out


def panels(template: Path = TEMPLATE) -> list[Panel]:
    """The panels of the shipped console template (group, title, PromQL)."""
    found = _parse(template.read_text())
    if not found:
        raise MonitorError(f"{template} has no div.sqlrl-panel")
    return found


def seconds(text: str) -> int:
    m = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if not m or int(m.group(1)) == 0:
        raise MonitorError(f"--range {text!r}: give a duration like 90s, 10m, 2h or 1d")
    return int(m.group(1)) * _UNITS[m.group(2)]


def page_url(s: Settings, range_text: str) -> str:
    hash_ = urllib.parse.quote(json.dumps({"duration": seconds(range_text), "endTime": 0}, separators=(",", ":")))
    return f"{s.prom_url}/{CONSOLE_PAGE}#pctc{hash_}"


def _chromium(s: Settings, args: list[str], timeout_s: float) -> str:
    binary = shutil.which(s.chromium)
    if not binary:
        raise MonitorError(f"{s.chromium!r} is not on PATH: run 'bash scripts/monitor.sh screenshot OUT.png' "
                           f"(it installs Debian's chromium) or set SQLRL_CHROMIUM to a Chromium binary")
    with tempfile.TemporaryDirectory(prefix="sqlrl-chromium-") as profile:
        cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
               "--hide-scrollbars", "--mute-audio", f"--user-data-dir={profile}", "--virtual-time-budget=30000",
               *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, env={**os.environ, "HOME": profile})
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise MonitorError(f"chromium did not finish within {timeout_s:.0f} s") from None
        finally:
            try:  # helpers (GPU, zygote) it forked and left behind
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if proc.returncode != 0:
        raise MonitorError(f"chromium exited {proc.returncode}: {err.strip().splitlines()[-1:] or ''}")
    return out


def screenshot(s: Settings, out: Path, range_text: str = "10m", size: str = "1600x2300",
               timeout_s: float = 180.0) -> PageReport:
    m = re.fullmatch(r"(\d+)x(\d+)", size)
    if not m:
        raise MonitorError(f"--size {size!r}: give WIDTHxHEIGHT in pixels, e.g. 1600x2300")
    url = page_url(s, range_text)
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    window = f"--window-size={m.group(1)},{m.group(2)}"
    out.unlink(missing_ok=True)
    _chromium(s, [window, f"--screenshot={out}", url], timeout_s)
    if not out.is_file() or out.stat().st_size == 0:
        raise MonitorError(f"chromium wrote no screenshot to {out} (is Prometheus up at {s.prom_url}?)")
    dom = _chromium(s, [window, "--dump-dom", url], timeout_s)
    found = _parse(dom)
    if not found:
        raise MonitorError(f"{url} has no sqlrl panels: is {s.prom_url} the Prometheus 'monitor.sh start' runs?")
    return PageReport(out, tuple(found))
