"""A job shown in a notebook: the HTML of ``Job._repr_html_`` (internal).

In the spirit of Dask's Client and Cluster widgets: a title with the job's name, then a
small table of its state, ranks, workers, progress and a link to its page on the Dask
dashboard. Everything shown is escaped (a job's name and worker addresses are user text).
"""

from __future__ import annotations

import html
from typing import Any

from dask_ddp._states import JobState

#: Every state's colour (tests/launch/test_summary.py checks that none is left out): blue
#: while it works, amber while it waits on something that may not come.
STATE_COLOURS = {JobState.STARTING: "#6baed6", JobState.RUNNING: "#2c7be5",
                 JobState.STALLED: "#e5a02c", JobState.RESTARTING: "#e5a02c",
                 JobState.DONE: "#2ca02c", JobState.FAILED: "#d62728",
                 JobState.CANCELLED: "#7f7f7f"}


def page_link(client: Any, job_id: str) -> str | None:
    """The URL of job ``job_id``'s page on the Dask dashboard (``None`` without one)."""
    link = getattr(client, "dashboard_link", None)
    if not link:
        return None
    return f"{link.rsplit('/', 1)[0]}/dask-ddp/job/{job_id}"


def job_html(job: Any, ranks_finished: int, page_link: str | None) -> str:
    """The HTML of ``job`` (a :class:`~dask_ddp.Job`) for Jupyter's rich display."""
    state = str(job.state)
    colour = STATE_COLOURS[JobState(state)]
    workers = sorted(set(job.workers))
    rows = [
        ("State", f'<span style="color: {colour}; font-weight: bold">'
                  f"{html.escape(state)}</span>"),
        ("Ranks", f"{job.world_size} ({ranks_finished} finished)"),
        ("Workers", html.escape(", ".join(workers[:4])
                                + (f" and {len(workers) - 4} more" if len(workers) > 4
                                   else ""))),
        ("Job id", f"<code>{html.escape(job.id)}</code>"),
    ]
    monitor = job.monitor
    if monitor is not None and monitor.count:
        rows.append(("Progress", f"{monitor.count} metric records"))
    if page_link:
        link = html.escape(page_link, quote=True)
        rows.append(("Job page", f'<a href="{link}" target="_blank">{link}</a>'))
    cells = "".join(f'<tr><th style="text-align: left">{k}</th>'
                    f'<td style="text-align: left">{v}</td></tr>' for k, v in rows)
    return (f'<div class="dask-ddp-job"><h3 style="margin-bottom: 4px">dask-ddp Job: '
            f"{html.escape(job.name)}</h3><table>{cells}</table></div>")
