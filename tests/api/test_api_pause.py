"""The two pauses, through a live server: the operator's pause (the API) and the operator's pause file.
``docs/operations.md``: a pause made through the API is never ended by the file's removal; a pause flag the server
cannot remove is a 409 naming it, never a 500."""

from __future__ import annotations

from pathlib import Path

import httpx
from api_support import API_TOKEN, WAIT_S, Live, MakeLive, poll_until

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


async def _queue(client: httpx.AsyncClient) -> dict[str, object]:
    answer = await client.get("/api/queue", timeout=WAIT_S)
    assert answer.status_code == 200
    return dict(answer.json())


def _flag(live: Live) -> Path:
    return live.supervisor.config.pause_flag_path


async def test_an_api_pause_made_while_the_file_paused_is_not_lifted_by_the_files_removal(make_live: MakeLive) -> None:
    live = await make_live(api_token=API_TOKEN)
    flag = _flag(live)
    async with httpx.AsyncClient(base_url=live.url, headers=AUTH, timeout=WAIT_S) as client:
        flag.touch()  # a repair script pauses with the file
        await live.supervisor.sweeper.sweep()  # the file is mirrored at the next look (a sweep, or a promotion round)
        assert (await _queue(client))["paused"] is True
        assert (await client.post("/api/queue/pause", timeout=WAIT_S)).status_code == 200  # the operator pauses too
        flag.unlink()  # the script is done
        await live.supervisor.sweeper.sweep()
        assert (await _queue(client))["paused"] is True  # still the operator's
        job = (await client.post("/api/jobs", json={"kind": "sleep", "params": {"seconds": 0}}, timeout=WAIT_S)).json()
        await live.supervisor.sweeper.sweep()
        assert (await client.get(f"/api/jobs/{job['job_id']}", timeout=WAIT_S)).json()["status"] == "queued"
        assert (await client.post("/api/queue/resume", timeout=WAIT_S)).status_code == 200  # only this ends it

        async def ran() -> bool | None:
            row = (await client.get(f"/api/jobs/{job['job_id']}", timeout=WAIT_S)).json()
            return True if row["status"] == "succeeded" else None

        await poll_until(ran)


async def test_a_pause_flag_that_is_a_directory_is_a_409_naming_it_and_the_queue_says_what_holds_it(
    make_live: MakeLive,
) -> None:
    live = await make_live(api_token=API_TOKEN)
    flag = _flag(live)
    flag.mkdir()
    try:
        async with httpx.AsyncClient(base_url=live.url, headers=AUTH, timeout=WAIT_S) as client:
            await live.supervisor.sweeper.sweep()
            resumed = await client.post("/api/queue/resume", timeout=WAIT_S)
            assert resumed.status_code == 409, resumed.text
            error = resumed.json()["error"]
            assert error["code"] == "conflict" and str(flag) in error["message"]
            state = await _queue(client)
            assert state["paused"] is True
            await live.supervisor.sweeper.sweep()
            assert "pause_file" in dict((await _queue(client))["held"])  # type: ignore[arg-type]
    finally:
        flag.rmdir()
