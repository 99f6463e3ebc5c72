"""A job in a REPL or notebook (_launch/client/summary.py and Job's own views): its repr, its
HTML, every rank's state while it runs, and report() numbering the steps itself."""

from __future__ import annotations

import html.parser
from types import SimpleNamespace
from typing import Any

import pytest

import dask_ddp
from cluster_util import client_fixture
from dashboard_util import dashboard_root, get, report_unnumbered, wait_job
from dask_ddp._states import JobState
from waits import wait_until

client = client_fixture(2)

STEPS = 40


class _Text(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.links: list[str] = []

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.links.extend(v or "" for k, v in attrs if tag == "a" and k == "href")


def test_a_running_job_shows_itself_and_every_rank(client: Any) -> None:
    job = dask_ddp.submit(client, report_unnumbered, STEPS, 0.1, name="note<book>",
                          progress=False)
    try:
        assert repr(job).startswith(f"<Job 'note<book>' id={job.id[:8]} running "
                                    "world_size=2 ranks_finished=0")
        states = job.rank_states()
        assert sorted(states) == [0, 1], states  # a healthy running job: every rank
        for rank, s in states.items():
            assert s["state"] == "working" and s["worker"] == job.workers[rank]
        page = _Text()
        page.feed(job._repr_html_())
        text = " ".join(page.text)
        assert "note<book>" in text and "running" in text and "2 (0 finished)" in text
        assert page.links == [f"{dashboard_root(client)}job/{job.id}"]
        status, _, _ = get(page.links[0])
        assert status == 200
        wait_until(lambda: None if job.monitor.count else "no record yet", 60,
                   "the first metric record of the job")
        assert "metric records" in job._repr_html_()
    finally:
        values = job.result(timeout=120)
    assert values == [0, 1]
    assert "done" in repr(job) and "ranks_finished=2" in repr(job)
    assert {s["state"] for s in job.rank_states().values()} <= {"returned", "finished"}
    steps = {r: [m["step"] for m in job.metrics() if m["rank"] == r] for r in (0, 1)}
    assert steps == {0: list(range(STEPS)), 1: list(range(STEPS))}
    done = wait_job(dashboard_root(client), job.id, "done with the steps numbered",
                    lambda j: j["state"] == "done" and len(j["ranks"]) == 2, timeout=60)
    assert [r["step"] for r in done["ranks"]] == [STEPS - 1, STEPS - 1]


@pytest.mark.parametrize("state", list(JobState))
def test_every_state_is_shown_in_its_own_colour(state: JobState) -> None:
    """A state added without a colour fails here, not in a user's notebook (``restarting``
    and ``starting`` once fell back to grey, the colour of ``cancelled``)."""
    from dask_ddp._launch.client.summary import STATE_COLOURS, job_html

    job = SimpleNamespace(state=state, workers=["tcp://a:1"], world_size=1, id="j",
                          name="n", monitor=None)
    page = job_html(job, 0, None)
    assert f'color: {STATE_COLOURS[state]}; font-weight: bold">{state}</span>' in page
    if state is not JobState.CANCELLED:
        assert STATE_COLOURS[state] != STATE_COLOURS[JobState.CANCELLED]
