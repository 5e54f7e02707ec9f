#!/usr/bin/env python3
"""Python client benchmark: single and batched gets and puts from 1, 4 and 16 Python
threads, beside the Rust client's figures and redis-py's, all measured in the same run.

What runs, in this order, each on this machine's loopback:

1. **python**: a local cluster (1 superpeer, ``--peers`` peers) of the given ``myriad``
   binary, ``--keys`` objects of ``--object-bytes`` preloaded (spread over the peers),
   then for each op (get, put), thread count and batch (1 and ``--batch``) a closed
   loop for ``--duration`` s after ``--warmup`` s: every Python thread has its own
   ``myriad.Client`` (one connection per peer each, like ``myriad bench kv``'s Rust
   threads) and calls back to back over uniform random keys: ``get``/``put`` for batch
   1, the numpy calls ``get_array``/``put_array`` of ``--batch`` CIDs for batches.
   A call that is the only one of the process waiting polls for its answer for the
   client's ``lane_spin`` (``--lane-spin-us``; by default the Rust client's 50 µs, as
   in ``myriad bench kv``) before its thread sleeps.
   With ``--tls`` the same again against a second cluster started with TLS
   (``local_cluster(tls=True)``: every connection TLS 1.3 with mutual authentication,
   lanes off), as rows **python-tls**, with python-tls / python ratio lines: the cost of
   TLS to the Python client, both measured in this run.
2. **rust**: ``myriad bench kv`` of the same binary with the same shape (peers, keys,
   object bytes, threads, batch, duration), the Rust client's figures (``--json``).
3. **redis**: ``redis-server`` on a free 127.0.0.1 port (no persistence), the same keys
   preloaded, redis-py with one connection per thread: GET/SET for batch 1, a
   non-transactional pipeline of ``--batch`` GETs/SETs for batches (equal depth).
   A missing ``redis-server`` or redis-py fails the run (no silent skip); whether
   redis-py parses with hiredis (the faster parser; scripts/bench-python installs it)
   is printed.

Printed: one line per configuration (ops/s, call latency p50/p99 in µs), then ratio
lines: python / rust at equal threads and batch (target for batched gets: ≥ 0.8) and
python / redis-py (target for batched gets: ≥ 3). ``--json`` prints one object per line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

import numpy as np

import myriad

TARGET_BATCHED_GET_VS_RUST = 0.8
TARGET_BATCHED_GET_VS_REDIS = 3.0
PRELOAD_BATCH = 1000
KEYS_PER_THREAD = 1 << 16


def closed_loop(
    workers: list[Callable[[np.ndarray], None]],
    keys: int,
    batch: int,
    warmup: float,
    duration: float,
    seed: int = 1,
) -> dict:
    """Runs each worker on its own thread over uniform random key indexes; measures the
    window after the warm-up. Returns ops/s and call latency percentiles (µs)."""
    start = threading.Barrier(len(workers) + 1)
    stop = threading.Event()
    measuring = threading.Event()
    results: list[Optional[tuple[int, list[int]]]] = [None] * len(workers)
    failures: list[BaseException] = []

    def run(index: int, worker: Callable[[np.ndarray], None]) -> None:
        rng = np.random.default_rng(seed + index)
        picks = rng.integers(0, keys, size=KEYS_PER_THREAD * batch if batch > 1 else KEYS_PER_THREAD)
        picks = picks.reshape(-1, batch)
        calls = 0
        latencies: list[int] = []
        row = 0
        start.wait()
        try:
            while not stop.is_set():
                chosen = picks[row]
                row = (row + 1) % len(picks)
                began = time.perf_counter_ns()
                worker(chosen)
                ended = time.perf_counter_ns()
                if measuring.is_set():
                    calls += 1
                    latencies.append(ended - began)
        except BaseException as error:  # noqa: BLE001 (reported by the caller)
            failures.append(error)
            stop.set()
        results[index] = (calls, latencies)

    threads = [threading.Thread(target=run, args=(i, w), daemon=True) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    start.wait()
    time.sleep(warmup)
    measuring.set()
    began = time.perf_counter()
    time.sleep(duration)
    stop.set()
    elapsed = time.perf_counter() - began
    for thread in threads:
        thread.join(60)
    if failures:
        raise RuntimeError(f"a worker failed: {failures[0]!r}") from failures[0]
    calls = sum(result[0] for result in results if result)
    latencies = np.concatenate(
        [np.asarray(result[1], dtype=np.int64) for result in results if result and result[1]]
        or [np.zeros(1, dtype=np.int64)]
    )
    return {
        "ops_per_sec": calls * batch / elapsed,
        "p50_us": float(np.percentile(latencies, 50)) / 1000,
        "p99_us": float(np.percentile(latencies, 99)) / 1000,
    }


# ----- Myriad from Python ---------------------------------------------------------------


# Both sides run without replication (R = 0), as `myriad bench kv --modes none` does.
NODE_CONFIG = "[backup]\nreplication = 0\n"


def write_config(directory: str) -> str:
    path = os.path.join(directory, "node.toml")
    with open(path, "w") as file:
        file.write(NODE_CONFIG)
    return path


def python_rows(args, binary: str, tls: bool = False) -> list[dict]:
    rows = []
    system = "python-tls" if tls else "python"
    with tempfile.TemporaryDirectory(prefix="myriad-bench-python-") as config_dir, \
            myriad.local_cluster(
                peers=args.peers, superpeers=1, binary=binary,
                peer_memory_mb=args.peer_memory_mb,
                config=write_config(config_dir),
                tls=tls,
            ) as cluster:
        spin = {} if args.lane_spin_us is None else {"lane_spin": args.lane_spin_us / 1e6}
        clients = [cluster.connect(timeout=10.0, **spin) for _ in range(max(args.threads))]
        try:
            first = clients[0]
            peers = first.peers()
            cids = []
            value_rows = np.full((PRELOAD_BATCH, args.object_bytes), 0x5A, dtype=np.uint8)
            while len(cids) < args.keys:
                count = min(PRELOAD_BATCH, args.keys - len(cids))
                peer = peers[(len(cids) // PRELOAD_BATCH) % len(peers)]
                cids.extend(first.create_array(peer, value_rows[:count], timeout=30.0))
            cids = np.asarray(cids, dtype=np.uint64)
            value = bytes([0xA5]) * args.object_bytes
            values = np.full((args.batch, args.object_bytes), 0xA5, dtype=np.uint8)
            size = args.object_bytes

            def worker(client: myriad.Client, op: str, batch: int):
                if op == "get" and batch == 1:
                    return lambda keys: client.get(int(cids[keys[0]]))
                if op == "put" and batch == 1:
                    return lambda keys: client.put(int(cids[keys[0]]), value)
                if op == "get":
                    return lambda keys: client.get_array(cids[keys], size)
                return lambda keys: client.put_array(cids[keys], values)

            for op in args.ops:
                for threads in args.threads:
                    for batch in (1, args.batch):
                        workers = [worker(clients[i], op, batch) for i in range(threads)]
                        measured = closed_loop(workers, args.keys, batch, args.warmup, args.duration)
                        rows.append(row(system, op, threads, batch, measured, args))
                        emit(rows[-1], args)
        finally:
            for client in clients:
                client.close()
    return rows


# ----- the Rust client (myriad bench kv) --------------------------------------------------


def rust_rows(args, binary: str) -> list[dict]:
    command = [
        binary, "bench", "kv", "--json", "--no-redis", "--no-memcached",
        "--modes", "none", "--drivers", "threads", "--idle-secs", "0",
        "--peers", str(args.peers),
        "--threads", ",".join(str(t) for t in args.threads),
        "--batch", str(args.batch),
        "--object-bytes", str(args.object_bytes),
        "--keys", str(args.keys),
        "--duration-secs", str(args.duration),
        "--warmup-secs", str(args.warmup),
        "--peer-memory-mb", str(args.peer_memory_mb),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"myriad bench kv failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = []
    for line in done.stdout.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("kind") == "result" and record.get("system") == "myriad":
            measured = {key: record[key] for key in ("ops_per_sec", "p50_us", "p99_us")}
            rows.append(row("rust", record["op"], record["clients"], record["depth"], measured, args))
            emit(rows[-1], args)
    if not rows:
        raise RuntimeError(f"myriad bench kv printed no result:\n{done.stdout[-3000:]}")
    return rows


# ----- redis-py on a local redis-server ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def redis_rows(args) -> list[dict]:
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    try:
        import redis  # noqa: PLC0415 (only this part needs it)
    except ImportError as error:
        raise RuntimeError("redis-py is not installed (pip install redis)") from error
    from redis.utils import HIREDIS_AVAILABLE  # noqa: PLC0415

    print(json.dumps({"kind": "baseline", "system": "redis-py", "version": redis.__version__,
                      "hiredis_parser": HIREDIS_AVAILABLE}), flush=True)
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="myriad-bench-redis-")
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    rows = []
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(host="127.0.0.1", port=port).ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)
        loader = redis.Redis(host="127.0.0.1", port=port)
        names = [f"k{index}".encode() for index in range(args.keys)]
        initial = bytes([0x5A]) * args.object_bytes
        for first in range(0, args.keys, PRELOAD_BATCH):
            pipe = loader.pipeline(transaction=False)
            for name in names[first : first + PRELOAD_BATCH]:
                pipe.set(name, initial)
            pipe.execute()
        value = bytes([0xA5]) * args.object_bytes
        connections = [redis.Redis(host="127.0.0.1", port=port) for _ in range(max(args.threads))]

        def worker(connection, op: str, batch: int):
            if op == "get" and batch == 1:
                return lambda keys: connection.get(names[keys[0]])
            if op == "put" and batch == 1:
                return lambda keys: connection.set(names[keys[0]], value)

            def pipelined(keys):
                pipe = connection.pipeline(transaction=False)
                for key in keys:
                    if op == "get":
                        pipe.get(names[key])
                    else:
                        pipe.set(names[key], value)
                pipe.execute()

            return pipelined

        for op in args.ops:
            for threads in args.threads:
                for batch in (1, args.batch):
                    workers = [worker(connections[i], op, batch) for i in range(threads)]
                    measured = closed_loop(workers, args.keys, batch, args.warmup, args.duration)
                    rows.append(row("redis-py", op, threads, batch, measured, args))
                    emit(rows[-1], args)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


# ----- output -------------------------------------------------------------------------------


def row(system: str, op: str, threads: int, batch: int, measured: dict, args) -> dict:
    return {"kind": "result", "system": system, "op": op, "threads": threads, "batch": batch,
            "object_bytes": args.object_bytes, **measured}


def emit(record: dict, args) -> None:
    if args.json:
        print(json.dumps(record), flush=True)
    elif record["kind"] == "result":
        print(f"{record['system']:>10} {record['op']:>3} threads {record['threads']:>2} "
              f"batch {record['batch']:>3}: {record['ops_per_sec']:>12,.0f} ops/s  "
              f"p50 {record['p50_us']:>9.1f} µs  p99 {record['p99_us']:>9.1f} µs", flush=True)
    else:
        ratio = "n/a" if record["ratio"] is None else f"{record['ratio']:.2f}"
        target = f" (target ≥ {record['target']})" if record.get("target") else ""
        print(f"   ratio {record['of']} / {record['to']} {record['op']} threads "
              f"{record['threads']:>2} batch {record['batch']:>3}: {ratio}{target}", flush=True)


def ratios(python: list[dict], others: list[dict], name: str, args, of: str = "python") -> None:
    if not others:
        return
    index = {(r["op"], r["threads"], r["batch"]): r for r in others}
    for mine in python:
        key = (mine["op"], mine["threads"], mine["batch"])
        other = index.get(key)
        target = None
        if mine["op"] == "get" and mine["batch"] > 1 and name in ("rust", "redis-py"):
            target = TARGET_BATCHED_GET_VS_RUST if name == "rust" else TARGET_BATCHED_GET_VS_REDIS
        emit({"kind": "ratio", "of": of, "to": name, "op": key[0], "threads": key[1],
              "batch": key[2], "target": target,
              "ratio": None if other is None else mine["ops_per_sec"] / other["ops_per_sec"]},
             args)


def machine(args) -> None:
    load = os.getloadavg()[0]
    record = {"kind": "machine", "cores": os.cpu_count(), "load_1min": round(load, 2),
              "python": sys.version.split()[0]}
    print(json.dumps(record) if args.json else f"machine: {record}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", help="the myriad binary (default: MYRIAD_BIN, the checkout's target/)")
    parser.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--peers", type=int, default=1)
    parser.add_argument("--object-bytes", type=int, default=64)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--peer-memory-mb", type=int, default=1024)
    parser.add_argument("--lane-spin-us", type=float, default=None,
                        help="the Python clients' lane_spin in µs (default: the client's; 0: never spin)")
    parser.add_argument("--ops", type=lambda s: s.split(","), default=["get", "put"])
    parser.add_argument("--skip", type=lambda s: s.split(","), default=[],
                        help="parts to leave out (python, rust, redis), e.g. for a quick look")
    parser.add_argument("--tls", action="store_true",
                        help="also measure the Python client against a TLS cluster (python-tls rows)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    binary = str(myriad.find_binary(args.binary))
    machine(args)
    python = python_rows(args, binary) if "python" not in args.skip else []
    python_tls = python_rows(args, binary, tls=True) if args.tls else []
    rust = rust_rows(args, binary) if "rust" not in args.skip else []
    redis = redis_rows(args) if "redis" not in args.skip else []
    ratios(python, rust, "rust", args)
    ratios(python, redis, "redis-py", args)
    ratios(python_tls, python, "python", args, of="python-tls")
    machine(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
