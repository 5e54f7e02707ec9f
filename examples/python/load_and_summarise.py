#!/usr/bin/env python3
"""Load a dataset into Myriad, read it back and summarise it with numpy.

A notebook-style walk through the Python client (run it top to bottom, or cell by cell):

1. start a local cluster (or use one: ``--cluster-dir DIR`` of ``myriad cluster start``);
2. make a dataset: sensor readings as a numpy structured array, one 16-byte record each;
3. load it: one chunk per record, spread over the peers with ``create_array``;
4. keep the CID list findable: in the cluster's temporary storage under a name;
5. read it back with ``get_array`` (one contiguous buffer) and check it;
6. summarise it with numpy: per-sensor count, mean, min and max.

Needs the ``myriad`` package (``pip install clients/python``) and a ``myriad`` binary
(``MYRIAD_BIN``, or ``target/{debug,release}/myriad`` of the checkout). Exits non-zero if
anything read back differs from what was loaded.
"""

import argparse
import contextlib
import sys
import time

import numpy as np

import myriad

# %% The dataset: readings of 16 bytes (sensor, timestamp, value).
READING = np.dtype([("sensor", "<u4"), ("time", "<u4"), ("value", "<f8")])


def make_dataset(rows: int, sensors: int, seed: int = 42) -> np.ndarray:
    """Deterministic synthetic readings: each sensor a noisy level of its own."""
    rng = np.random.default_rng(seed)
    data = np.empty(rows, dtype=READING)
    data["sensor"] = rng.integers(0, sensors, size=rows)
    data["time"] = np.arange(rows, dtype=np.uint32)
    data["value"] = data["sensor"] * 10.0 + rng.normal(0.0, 1.0, size=rows)
    return data


# %% Loading: the records as rows of bytes, split over the peers.
def load(client: myriad.Client, data: np.ndarray) -> np.ndarray:
    """Creates one chunk per record, spread over the peers; returns the CIDs in order."""
    peers = client.peers()
    as_bytes = data.view(np.uint8).reshape(len(data), READING.itemsize)
    parts = np.array_split(as_bytes, len(peers))
    return np.concatenate(
        [client.create_array(peer, part, timeout=30.0) for peer, part in zip(peers, parts)]
    )


# %% Reading back: one call, one contiguous buffer, viewed as records again.
def read_back(client: myriad.Client, cids: np.ndarray) -> np.ndarray:
    raw = client.get_array(cids, READING.itemsize, timeout=30.0)
    return raw.view(READING).ravel()


# %% Summary with numpy.
def summarise(data: np.ndarray, sensors: int) -> np.ndarray:
    """Per sensor: count, mean, min, max of the values."""
    summary = np.zeros(sensors, dtype=[("sensor", "<u4"), ("count", "<i8"),
                                       ("mean", "<f8"), ("min", "<f8"), ("max", "<f8")])
    summary["sensor"] = np.arange(sensors)
    summary["count"] = np.bincount(data["sensor"], minlength=sensors)
    sums = np.bincount(data["sensor"], weights=data["value"], minlength=sensors)
    summary["mean"] = sums / np.maximum(summary["count"], 1)
    summary["min"] = np.inf
    summary["max"] = -np.inf
    np.minimum.at(summary["min"], data["sensor"], data["value"])
    np.maximum.at(summary["max"], data["sensor"], data["value"])
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--sensors", type=int, default=8)
    parser.add_argument("--cluster-dir", help="use this running cluster instead of a new one")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        # %% A cluster: a running one, or a local one for this script.
        if args.cluster_dir:
            client = stack.enter_context(myriad.Client.connect(cluster_dir=args.cluster_dir))
        else:
            cluster = stack.enter_context(myriad.local_cluster(peers=3, peer_memory_mb=128))
            print(f"local cluster in {cluster.dir}: peers {cluster.peer_ids}")
            client = stack.enter_context(cluster.connect(timeout=10.0))

        data = make_dataset(args.rows, args.sensors)
        started = time.perf_counter()
        cids = load(client, data)
        loaded = time.perf_counter() - started
        print(f"loaded {len(cids)} readings of {READING.itemsize} bytes in {loaded:.3f} s")

        # %% The CID list in temporary storage, so that other programs can find it.
        client.tmp_put("example-readings", cids.tobytes())
        found = np.frombuffer(client.tmp_get("example-readings"), dtype=np.uint64)

        started = time.perf_counter()
        back = read_back(client, found)
        read = time.perf_counter() - started
        print(f"read them back in {read:.3f} s")
        if not np.array_equal(back, data):
            print("MISMATCH: the data read back differs from the data loaded", file=sys.stderr)
            return 1

        summary = summarise(back, args.sensors)
        print("sensor  count      mean       min       max")
        for row in summary:
            print(f"{row['sensor']:>6} {row['count']:>6} {row['mean']:>9.3f} "
                  f"{row['min']:>9.3f} {row['max']:>9.3f}")
        expected = summarise(data, args.sensors)
        if not np.array_equal(summary, expected):
            print("MISMATCH: the summary differs from the source's", file=sys.stderr)
            return 1

        client.remove_array(found, timeout=30.0)
        client.tmp_remove("example-readings")
        print("summary matches the source data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
