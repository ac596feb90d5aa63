"""The middleware's background work (rl_server.late): bounded in count and
in time, a late call's reply undone once, a failed call left alone."""

from __future__ import annotations

import asyncio
from typing import List

from rl_server.late import Background


def test_bounded_in_count_and_time() -> None:
    async def main() -> None:
        bg = Background(limit=2, seconds=0.2)
        stalled = [asyncio.get_running_loop().create_future() for _ in range(3)]
        undone: List[int] = []

        async def undo(v: int) -> None:
            undone.append(v)

        for f in stalled:  # a stalled Redis: none of them ever answers
            bg.settle(f, undo, "stalled call")
        assert len(bg) == 2 and stalled[2].cancelled()  # the third dropped at once, cancelled
        for _ in range(100):  # bounded wait
            if len(bg) == 0:
                break
            await asyncio.sleep(0.05)
        assert len(bg) == 0 and all(f.cancelled() for f in stalled) and undone == []

    asyncio.run(main())


def test_late_reply_undone_once_and_failures_left_alone() -> None:
    async def main() -> None:
        bg = Background(limit=10, seconds=5)
        loop = asyncio.get_running_loop()
        late, failed, done = loop.create_future(), loop.create_future(), loop.create_future()
        undone: List[int] = []

        async def undo(v: int) -> None:
            undone.append(v)

        failed.set_exception(ConnectionError("gone"))
        done.set_result(7)  # answered just as the deadline passed: undone all the same
        for f in (late, failed, done):
            bg.settle(f, lambda v: undo(v) if v else None, "call")
        assert len(bg) == 2  # nothing to wait for on a failed call
        late.set_result(3)
        for _ in range(100):
            if len(bg) == 0:
                break
            await asyncio.sleep(0.01)
        assert sorted(undone) == [3, 7]

    asyncio.run(main())
