"""The job pages on the scheduler: its extension, its plugin and its HTTP routes.

:class:`DashboardPlugin` is registered by the launcher when a job starts (idempotent, the
same round trip as the results channel's plugin). On the scheduler it installs
:class:`DashboardExtension`, which

- answers ``dask_ddp_dashboard_job`` (the launcher's job events: started, state changes)
  and ``dask_ddp_dashboard_rank`` (the supervisors' rank samples), both cheap dictionary
  updates on the scheduler's event loop;
- takes the jobs' failure records from the scheduler's event log (the plugin's
  :meth:`~DashboardPlugin.log_event`: topics ``dask-ddp-failure-<job id>``);
- adds the pages and their JSON to the scheduler's own HTTP server (the dashboard's port)
  at run time, under its HTTP prefix: ``/dask-ddp/``, ``/dask-ddp/job/<id>``,
  ``/dask-ddp/api/jobs``, ``/dask-ddp/api/job/<id>`` and ``/dask-ddp/static/``;
- adds a "Dask-Ddp" tab to the standard dashboard's navigation bar when the Bokeh
  dashboard runs (its page list is shared by every page it renders).

The JSON is answered from the state in memory (a walk over the jobs: no I/O, no task
state) and an open page asks for it every :data:`REFRESH_S` seconds; the page files are
read once (the HTML) or served by tornado's static file handler.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web

from dask_ddp._dashboard import intake
from dask_ddp._dashboard.model import Board

logger = logging.getLogger(__name__)

PLUGIN_NAME = "dask-ddp-dashboard"
EXTENSION = "dask_ddp_dashboard"
#: The failure topics of the jobs (the launcher's ``names.failure_topic``).
FAILURE_PREFIX = "dask-ddp-failure-"
#: The results extension's event topic for a full topic nobody reads (its
#: ``UNREAD_EVENT``; the job pages import nothing of the channel).
RESULTS_UNREAD = "dask-ddp-results-unread"
#: Seconds between two refreshes of an open page.
REFRESH_S = 2.0
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
TAB = "dask-ddp"


class DashboardExtension:
    """Keeps the :class:`~dask_ddp._dashboard.model.Board` and serves it (see the module)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.board = Board()
        scheduler.handlers.update({
            "dask_ddp_dashboard_job": self.job_event,
            "dask_ddp_dashboard_rank": self.rank_sample,
        })
        self.prefix = add_routes(scheduler, self)
        add_tab(scheduler)

    def job_event(self, job_id: str, event: dict[str, Any]) -> None:
        """A launcher event: ``{"kind": "started", ...}`` or ``{"kind": "state", ...}``."""
        self._take(intake.take_job_event, job_id, event, "job event")

    def rank_sample(self, job_id: str, sample: dict[str, Any]) -> None:
        self._take(intake.take_rank_sample, job_id, sample, "rank sample")

    def failure(self, topic: str, msg: Any) -> None:
        self._take(intake.take_failure, topic[len(FAILURE_PREFIX):], msg, "failure record")

    def results_unread(self, msg: Any) -> None:
        try:
            intake.take_results_unread(self.board, msg)
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("dask-ddp dashboard: refused a results event: %s", exc)

    def _take(self, take: Any, job_id: Any, message: Any, what: str) -> None:
        """One message into the board, checked at the edge; a refused one is logged with
        its reason and changes nothing (:mod:`~dask_ddp._dashboard.intake`)."""
        try:
            take(self.board, job_id, message)
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("dask-ddp dashboard: refused a %s for job %s: %s", what,
                           str(job_id)[:60], exc)


class DashboardPlugin(SchedulerPlugin):
    """Installs :class:`DashboardExtension` on the scheduler (registered idempotently)."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.extension: DashboardExtension | None = None

    async def start(self, scheduler: Any) -> None:
        ext = scheduler.extensions.get(EXTENSION)
        if ext is None:
            ext = scheduler.extensions[EXTENSION] = DashboardExtension(scheduler)
        self.extension = ext

    def log_event(self, topic: str, msg: Any) -> None:
        if self.extension is None:
            return
        if topic.startswith(FAILURE_PREFIX):
            self.extension.failure(topic, msg)
        elif topic == RESULTS_UNREAD:
            self.extension.results_unread(msg)


# --------------------------------------------------------------------------- HTTP routes


class _Base(web.RequestHandler):
    def initialize(self, extension: DashboardExtension) -> None:
        self.extension = extension

    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")


class JobsPage(_Base):
    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(_page("jobs.html"))


class JobPage(_Base):
    def get(self, job: str) -> None:
        if self.extension.board.find(job) is None:
            self.set_status(404)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(_page("job.html"))


def page_json(body: Any) -> str:
    """``body`` as strict JSON (RFC 8259): a non-finite number (a diverged loss) becomes
    the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``; Python's ``NaN`` token, which no
    browser parses, never reaches the page."""
    try:
        return json.dumps(body, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(body), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class JobsApi(_Base):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.write(page_json(self.extension.board.jobs_json()))


class JobApi(_Base):
    def get(self, job: str) -> None:
        self.set_header("Content-Type", "application/json")
        body = self.extension.board.job_json(job, self.get_argument("metric", None))
        if body is None:
            self.set_status(404)
            body = {"version": 1, "error": f"no dask-ddp job {job!r} on this scheduler"}
        self.write(page_json(body))


_pages: dict[str, str] = {}


def _page(name: str) -> str:
    text = _pages.get(name)
    if text is None:
        with open(os.path.join(STATIC, name), encoding="utf-8") as f:
            text = _pages[name] = f.read().replace("{{refresh_ms}}", str(int(REFRESH_S * 1000)))
    return text


def http_prefix(application: Any) -> str:
    """The scheduler's HTTP prefix ("/" or "/prefix/"), read from a route Dask added with it
    (``/health`` is always there)."""
    for rule in application.wildcard_router.rules:
        pattern = getattr(getattr(rule, "matcher", None), "regex", None)
        text = pattern.pattern if pattern is not None else ""
        if text.endswith("health$"):
            head = text[: -len("health$")]
            return head if head.endswith("/") else head + "/"
    return "/"


def add_routes(scheduler: Any, extension: DashboardExtension) -> str | None:
    """Add the pages to the scheduler's HTTP server; its prefix, or None without one."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        logger.info("dask-ddp dashboard: the scheduler has no HTTP server; no job pages")
        return None
    p = http_prefix(app)
    kw = {"extension": extension}
    app.add_handlers(r".*", [
        (rf"{p}dask-ddp", web.RedirectHandler, {"url": f"{p}dask-ddp/"}),
        (rf"{p}dask-ddp/", JobsPage, kw),
        (rf"{p}dask-ddp/job/([0-9A-Za-z_.-]+)/?", JobPage, kw),
        (rf"{p}dask-ddp/api/jobs", JobsApi, kw),
        (rf"{p}dask-ddp/api/job/([0-9A-Za-z_.-]+)", JobApi, kw),
        (rf"{p}dask-ddp/static/(.*)", web.StaticFileHandler, {"path": STATIC}),
    ])
    return p


def add_tab(scheduler: Any) -> None:
    """A "dask-ddp" tab in the Bokeh dashboard's navigation bar, when it runs here."""
    app = getattr(scheduler, "http_application", None)
    if app is None or not any("bokeh" in type(a).__name__.lower()
                              for a in getattr(app, "applications", ())):
        return  # no standard dashboard pages to link from
    try:
        from distributed.dashboard.scheduler import template_variables

        # Memoized per scheduler: the dict every dashboard page renders its bar from.
        pages = template_variables(scheduler).get("pages")
        if isinstance(pages, list) and TAB not in pages:
            pages.append(TAB)
    except Exception:  # a Dask whose dashboard changed: no tab, the pages still work
        logger.debug("dask-ddp dashboard: no tab in the Dask dashboard", exc_info=True)
