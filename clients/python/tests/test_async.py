"""The asyncio face: the same calls as awaitables, resolved by the client's runtime."""

import asyncio
import time

import numpy as np
import pytest

import myriad


def test_many_gets_in_flight_at_once(client, peer):
    cids = client.create_with_data(peer, [bytes([i]) * 4 for i in range(100)])

    async def main():
        aio = client.aio
        return await asyncio.gather(*(aio.get(cid) for cid in cids))

    assert asyncio.run(main()) == [bytes([i]) * 4 for i in range(100)]


def test_async_calls_cover_chunks_arrays_and_metadata(client, peer):
    async def main():
        aio = client.aio
        cid = await aio.create(peer, 4)
        await aio.put(cid, b"abcd", durability="durable")
        assert await aio.get(cid) == b"abcd"
        await aio.write_at(cid, 1, b"XY")
        assert await aio.read_at(cid, 0, 4) == b"aXYd"
        await aio.name_register("pytest-async", cid)
        assert await aio.name_get("pytest-async") == cid
        cids = await aio.create_array(peer, np.full((5, 2), 3, dtype=np.uint8))
        assert (await aio.get_array(cids, 2)).sum() == 30
        assert any(node["role"] == "peer" for node in await aio.nodes())
        assert (await aio.status())["leader"] == 1
        async with aio.lock(cid, wait=1.0):
            pass
        await aio.name_remove("pytest-async")

    asyncio.run(main())


def test_async_errors_raise_from_await(client, peer):
    async def main():
        aio = client.aio
        cid = await aio.create(peer, 4)
        await aio.remove(cid)
        with pytest.raises(myriad.NotFoundError):
            await aio.get(cid)
        barrier = await aio.barrier_alloc(2)
        started = time.monotonic()
        with pytest.raises(myriad.TimeoutError):
            await aio.barrier_sign_on(barrier, 1, timeout=0.3)
        assert time.monotonic() - started < 3.0
        await aio.barrier_free(barrier)

    asyncio.run(main())


def test_the_event_loop_runs_while_a_call_waits(client):
    """A call waiting 0.5 s must not block the loop: a ticker runs meanwhile."""

    async def main():
        aio = client.aio
        barrier = await aio.barrier_alloc(2)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        with pytest.raises(myriad.TimeoutError):
            await aio.barrier_sign_on(barrier, 1, timeout=0.5)
        task.cancel()
        await aio.barrier_free(barrier)
        return ticks

    assert asyncio.run(main()) >= 10


def test_connect_async(cluster):
    async def main():
        aio = await myriad.connect_async(cluster_dir=str(cluster.dir))
        try:
            peers = await aio.peers()
            cid = (await aio.create_with_data(peers[0], [b"async"]))[0]
            return await aio.get(cid)
        finally:
            aio.close()

    assert asyncio.run(main()) == b"async"
