"""numpy batch calls: CIDs as uint64 arrays, values as one contiguous buffer."""

import numpy as np
import pytest

import myriad


def test_create_array_and_get_array_round_trip_any_dtype(client, peer):
    values = np.arange(500 * 4, dtype=np.float64).reshape(500, 4)
    cids = client.create_array(peer, values)
    assert cids.dtype == np.uint64 and cids.shape == (500,)
    raw = client.get_array(cids, 32)
    assert raw.dtype == np.uint8 and raw.shape == (500, 32)
    assert raw.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(raw.view(np.float64), values)


def test_put_array_overwrites_rows_in_cid_order(client, peer):
    cids = client.create_array(peer, np.zeros((100, 8), dtype=np.uint8))
    order = np.random.default_rng(7).permutation(100)
    rows = np.arange(100, dtype=np.int64).reshape(100, 1)
    client.put_array(cids[order], rows[order], durability="replicated")
    back = client.get_array(cids, 8).view(np.int64).ravel()
    np.testing.assert_array_equal(back, np.arange(100))


def test_cids_may_be_a_list_or_a_strided_int64_array(client, peer):
    cids = client.create_array(peer, np.full((10, 2), 9, dtype=np.uint8))
    as_list = [int(cid) for cid in cids]
    assert client.get_array(as_list, 2).sum() == 10 * 2 * 9
    strided = cids.astype(np.int64)[::2]
    assert client.get_array(strided, 2).shape == (5, 2)


def test_get_packed_reads_chunks_of_different_sizes(client, peer):
    payloads = [b"z", b"a", b"bb", b"ccc" * 100]
    cids = client.create_with_data(peer, payloads)
    data, offsets = client.get_packed(np.array(cids, dtype=np.uint64))
    assert data.dtype == np.uint8 and offsets.dtype == np.uint64
    assert list(offsets) == [0, 1, 2, 4, 304]
    for index, payload in enumerate(payloads):
        assert data[offsets[index] : offsets[index + 1]].tobytes() == payload


def test_a_chunk_of_another_size_fails_get_array_with_its_index(client, peer):
    cids = client.create_with_data(peer, [b"1234", b"12345", b"1234"])
    with pytest.raises(myriad.InvalidArgumentError) as caught:
        client.get_array(cids, 4)
    assert caught.value.index == 1


def test_missing_chunk_fails_with_its_index_and_remove_array(client, peer):
    cids = client.create_array(peer, np.ones((6, 3), dtype=np.uint8))
    client.remove_array(cids[4:])
    with pytest.raises(myriad.NotFoundError) as caught:
        client.get_array(cids, 3)
    assert caught.value.index == 4
    assert caught.value.cid == int(cids[4])


def test_large_arrays_go_in_pieces_over_all_peers(client):
    peers = client.peers()
    rows = 30_000
    values = np.random.default_rng(1).integers(0, 256, size=(rows, 16), dtype=np.uint8)
    parts = np.array_split(values, len(peers))
    cids = np.concatenate(
        [client.create_array(peer, part, timeout=20.0) for peer, part in zip(peers, parts)]
    )
    assert len(np.unique(cids >> np.uint64(48))) == len(peers)
    shuffled = np.random.default_rng(2).permutation(rows)
    back = client.get_array(cids[shuffled], 16, timeout=20.0)
    np.testing.assert_array_equal(back, values[shuffled])
    client.remove_array(cids, timeout=20.0)


def test_values_rows_must_match_the_cids(client, peer):
    cids = client.create_array(peer, np.zeros((3, 4), dtype=np.uint8))
    with pytest.raises(ValueError):
        client.put_array(cids, np.zeros((2, 4), dtype=np.uint8))
