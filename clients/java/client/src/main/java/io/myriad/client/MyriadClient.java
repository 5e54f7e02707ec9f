package io.myriad.client;

import io.myriad.client.net.Endpoint;
import io.myriad.client.proto.ChunkProto;
import io.myriad.client.proto.ChunkReply;
import io.myriad.client.proto.ItemError;
import io.myriad.client.proto.MetaProto;
import io.myriad.client.proto.MetaReply;
import io.myriad.client.proto.MetaResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A connection to a Myriad cluster: the chunk API (create, get, put, remove and their
 * batches, offset access, resize, locks, status, per-peer listing and statistics) and the
 * metadata services (nameservice, barriers, temporary storage, node list).
 *
 * <p>The client joins the cluster as a node of role client (the superpeers assign its ID
 * and watch it with heartbeats, which it answers) and leaves on {@link #close}. Every call
 * exists as a blocking method and as an {@code ...Async} method returning a
 * {@link CompletableFuture}; async futures complete on the client's I/O threads, so
 * callbacks must not block (use the {@code ...Async} stages with an executor for that).
 *
 * <p>Thread-safe: one client is meant to be shared by all threads of a process; each node
 * gets one connection, on which any number of requests are in flight at once.
 *
 * <p>Every call ends within its timeout ({@link ClientConfig#chunkTimeout},
 * {@link ClientConfig#metaTimeout}) with its result or a {@link MyriadException} subclass;
 * nothing a server sends raises anything but {@link MyriadException.Protocol}.
 */
public final class MyriadClient implements AutoCloseable {
    private final ClientConfig config;
    private final Endpoint endpoint;
    private final Membership membership;
    private final Router router;
    private final AtomicBoolean closed = new AtomicBoolean();

    private MyriadClient(ClientConfig config, Endpoint endpoint, Membership membership) {
        this.config = config;
        this.endpoint = endpoint;
        this.membership = membership;
        this.router = new Router(membership, endpoint, config);
    }

    /**
     * Joins the cluster; blocks until the superpeers assigned this client its ID. A
     * {@code null} {@link ClientConfig#secret} is set here from the file named by
     * {@value ClientConfig#SECRET_FILE_ENV}; with neither, throws
     * {@link MyriadException.InvalidArgument} before dialing anyone. With
     * {@link ClientConfig#tls} set every connection runs over TLS.
     */
    public static MyriadClient connect(ClientConfig config) {
        if (config.superpeers.isEmpty()) {
            throw new MyriadException.InvalidArgument("no superpeer configured");
        }
        config.secret = ClientConfig.resolveSecret(config.secret, System.getenv());
        Endpoint endpoint = new Endpoint(0, config.secret, config.listen, (int) config.connectTimeout.toMillis(),
                config.tls);
        try {
            for (Map.Entry<Integer, java.net.InetSocketAddress> superpeer : config.superpeers.entrySet()) {
                endpoint.setAddress(superpeer.getKey(), superpeer.getValue());
            }
            Membership membership = new Membership(config, endpoint);
            membership.join();
            return new MyriadClient(config, endpoint, membership);
        } catch (RuntimeException e) {
            endpoint.close();
            throw e;
        }
    }

    /**
     * Joins the cluster of the superpeer list {@code "1=127.0.0.1:P,..."} with defaults and
     * the secret of the file named by {@value ClientConfig#SECRET_FILE_ENV} (refused without).
     */
    public static MyriadClient connect(String superpeerList) {
        return connect(ClientConfig.of(superpeerList));
    }

    /** Joins the cluster of the superpeer list with defaults and the cluster secret {@code secret}. */
    public static MyriadClient connect(String superpeerList, byte[] secret) {
        ClientConfig config = ClientConfig.of(superpeerList);
        config.secret = secret.clone();
        return connect(config);
    }

    /** This client's node ID. */
    public int nodeId() {
        return endpoint.nodeId();
    }

    /** The configuration in effect. */
    public ClientConfig config() {
        return config;
    }

    private int level(Durability durability) {
        return (durability == null ? config.durability : durability).code;
    }

    private long blockingWaitMs() {
        return Math.max(config.chunkTimeout.toMillis(), config.metaTimeout.toMillis()) + 5_000;
    }

    /** Waits for an async call: its value, or its {@link MyriadException} thrown. */
    private <T> T await(CompletableFuture<T> future, long extraMs) {
        try {
            return future.get(blockingWaitMs() + extraMs, TimeUnit.MILLISECONDS);
        } catch (ExecutionException e) {
            Throwable cause = Membership.unwrap(e);
            if (cause instanceof MyriadException) {
                throw (MyriadException) cause;
            }
            throw new MyriadException("call failed: " + cause, cause);
        } catch (TimeoutException e) {
            throw new MyriadException.Timeout("client call", blockingWaitMs() + extraMs);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new MyriadException("interrupted");
        }
    }

    private <T> T await(CompletableFuture<T> future) {
        return await(future, 0);
    }

    private static <T> CompletableFuture<T> single(CompletableFuture<List<ItemResult<T>>> batch) {
        return batch.thenApply(results -> {
            if (results.size() != 1) {
                throw new MyriadException.Protocol("no result for the item");
            }
            return results.get(0).get();
        });
    }

    private void checkOpen() {
        if (closed.get()) {
            throw new MyriadException.Shutdown();
        }
    }

    // ----- nodes ---------------------------------------------------------------------------

    /** The node table as this client knows it (kept current by the superpeers' events). */
    public List<NodeInfo> cachedNodes() {
        return membership.nodes();
    }

    /** Lanes open to {@code node}: blocking single-chunk calls use them (for tests and diagnostics). */
    int laneCount(int node) {
        return endpoint.laneCount(node);
    }

    /** The alive peers (chunk stores) as this client knows them, by ID. */
    public List<Integer> peers() {
        List<Integer> peers = new ArrayList<>();
        for (NodeInfo node : membership.nodes()) {
            if (node.isPeer() && node.isAlive()) {
                peers.add(node.id());
            }
        }
        peers.sort(null);
        return peers;
    }

    /** The superpeers' node table (fresh). */
    public CompletableFuture<List<NodeInfo>> nodesAsync() {
        return membership.request(MetaProto.nodes(), false).thenApply(reply -> {
            expect(reply, MetaReply.NODES);
            return reply.nodes;
        });
    }

    /** See {@link #nodesAsync}. */
    public List<NodeInfo> nodes() {
        return await(nodesAsync());
    }

    /** The group's state as the answering superpeer sees it (the leader as far as known, else any). */
    public SuperpeerStatus superpeerStatus() {
        MetaReply reply = await(membership.request(MetaProto.status(), false));
        expect(reply, MetaReply.STATUS);
        long[] s = reply.status;
        return new SuperpeerStatus((int) s[0], s[1], (int) s[2], s[3], reply.members);
    }

    private static void expect(MetaReply reply, int tag) {
        if (reply.tag != tag) {
            throw new MyriadException.Protocol("unexpected superpeer reply tag " + reply.tag);
        }
    }

    // ----- create ----------------------------------------------------------------------------

    private CompletableFuture<long[]> created(int peer, byte[] request, int count) {
        checkOpen();
        long deadline = System.nanoTime() + config.chunkTimeout.toNanos();
        return createAttempt(peer, request, deadline).thenApply(reply -> {
            if (reply.tag == ChunkReply.CREATED) {
                if (reply.cids.length != count) {
                    throw new MyriadException.Protocol("create answered " + reply.cids.length + " CIDs for " + count);
                }
                return reply.cids;
            }
            if (reply.tag == ChunkReply.FAILED) {
                ItemError error = reply.failed;
                if (error.code == ItemError.TOO_LARGE || error.code == ItemError.OUT_OF_MEMORY) {
                    throw new MyriadException.OutOfSpace(peer, error.toString());
                }
                if (error.code == ItemError.INVALID) {
                    throw new MyriadException.InvalidArgument("node " + ChunkIds.formatNode(peer) + " refused: " + error.text);
                }
                throw new MyriadException.Server(peer, error.toString());
            }
            throw Router.wrongReply(reply, "created");
        });
    }

    /** A peer whose lease lapsed for a moment refuses creates with "not owner": ask again, paced. */
    private CompletableFuture<ChunkReply> createAttempt(int peer, byte[] request, long deadline) {
        long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
        return router.callNode(peer, request, Math.max(1, left)).thenCompose(reply -> {
            boolean notOwner = reply.tag == ChunkReply.FAILED && reply.failed.code == ItemError.NOT_OWNER;
            if (notOwner && System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Router.RECOVERY_POLL_MS) < deadline) {
                return CompletableFuture.supplyAsync(() -> null,
                        CompletableFuture.delayedExecutor(Router.RECOVERY_POLL_MS, TimeUnit.MILLISECONDS))
                        .thenCompose(ignored -> createAttempt(peer, request, deadline));
            }
            return CompletableFuture.completedFuture(reply);
        });
    }

    /** Creates zeroed chunks of these sizes on {@code peer} (all or nothing); their CIDs. */
    public CompletableFuture<long[]> createAsync(int peer, long[] sizes, Durability durability) {
        return created(peer, ChunkProto.create(level(durability), sizes), sizes.length);
    }

    /** See {@link #createAsync}. */
    public long[] create(int peer, long[] sizes, Durability durability) {
        return await(createAsync(peer, sizes, durability));
    }

    /** Creates one zeroed chunk of {@code size} bytes on {@code peer}. */
    public long create(int peer, long size) {
        return create(peer, new long[] {size}, null)[0];
    }

    /** Creates chunks holding these payloads on {@code peer} (all or nothing); their CIDs. */
    public CompletableFuture<long[]> createWithDataAsync(int peer, List<byte[]> payloads, Durability durability) {
        return created(peer, ChunkProto.createWithData(level(durability), payloads), payloads.size());
    }

    /** See {@link #createWithDataAsync}. */
    public long[] createWithData(int peer, List<byte[]> payloads, Durability durability) {
        return await(createWithDataAsync(peer, payloads, durability));
    }

    /** Creates one chunk holding {@code data} on {@code peer}. */
    public long createWithData(int peer, byte[] data) {
        return createWithData(peer, List.of(data), null)[0];
    }

    // ----- routed access ---------------------------------------------------------------------

    /** Reads many chunks; one result per CID, in order. */
    public CompletableFuture<List<ItemResult<byte[]>>> getBatchAsync(long[] cids) {
        checkOpen();
        return router.routed(cids, 0, indices -> ChunkProto.get(pick(cids, indices)), Router.DATA);
    }

    /** See {@link #getBatchAsync}. */
    public List<ItemResult<byte[]>> getBatch(long[] cids) {
        return await(getBatchAsync(cids));
    }

    /** Reads one chunk. */
    public CompletableFuture<byte[]> getAsync(long cid) {
        return single(getBatchAsync(new long[] {cid}));
    }

    /** See {@link #getAsync}; sent and decoded on the calling thread. */
    public byte[] get(long cid) {
        checkOpen();
        return (byte[]) router.single(cid, indices -> ChunkProto.get(new long[] {cid}), Router.DATA);
    }

    /** Replaces many chunks' bytes ({@code data[i]} must have the size of {@code cids[i]}). */
    public CompletableFuture<List<ItemResult<Void>>> putBatchAsync(long[] cids, byte[][] data, Durability durability) {
        checkOpen();
        if (cids.length != data.length) {
            return CompletableFuture.failedFuture(new MyriadException.InvalidArgument("CIDs and payloads differ in number"));
        }
        int level = level(durability);
        return router.routed(cids, 0, indices -> {
            byte[][] picked = new byte[indices.length][];
            for (int i = 0; i < indices.length; i++) {
                picked[i] = data[indices[i]];
            }
            return ChunkProto.put(level, pick(cids, indices), picked);
        }, Router.STATUSES);
    }

    /** See {@link #putBatchAsync}. */
    public List<ItemResult<Void>> putBatch(long[] cids, byte[][] data, Durability durability) {
        return await(putBatchAsync(cids, data, durability));
    }

    /** Replaces one chunk's bytes. */
    public CompletableFuture<Void> putAsync(long cid, byte[] data, Durability durability) {
        return single(putBatchAsync(new long[] {cid}, new byte[][] {data}, durability));
    }

    /** See {@link #putAsync}; sent and decoded on the calling thread. */
    public void put(long cid, byte[] data, Durability durability) {
        checkOpen();
        int level = level(durability);
        router.single(cid, indices -> ChunkProto.put(level, new long[] {cid}, new byte[][] {data}), Router.STATUSES);
    }

    /** Replaces one chunk's bytes with the default durability. */
    public void put(long cid, byte[] data) {
        put(cid, data, null);
    }

    /** Removes many chunks; one result per CID. */
    public CompletableFuture<List<ItemResult<Void>>> removeBatchAsync(long[] cids, Durability durability) {
        checkOpen();
        int level = level(durability);
        return router.routed(cids, 0, indices -> ChunkProto.remove(level, pick(cids, indices)), Router.STATUSES);
    }

    /** See {@link #removeBatchAsync}. */
    public List<ItemResult<Void>> removeBatch(long[] cids, Durability durability) {
        return await(removeBatchAsync(cids, durability));
    }

    /** Removes one chunk. */
    public CompletableFuture<Void> removeAsync(long cid, Durability durability) {
        return single(removeBatchAsync(new long[] {cid}, durability));
    }

    /** See {@link #removeAsync}; sent and decoded on the calling thread. */
    public void remove(long cid, Durability durability) {
        checkOpen();
        int level = level(durability);
        router.single(cid, indices -> ChunkProto.remove(level, new long[] {cid}), Router.STATUSES);
    }

    /** Removes one chunk with the default durability. */
    public void remove(long cid) {
        remove(cid, null);
    }

    /** The sizes of many chunks in bytes; one result per CID. */
    public CompletableFuture<List<ItemResult<Long>>> sizeBatchAsync(long[] cids) {
        checkOpen();
        return router.routed(cids, 0, indices -> ChunkProto.status(pick(cids, indices)), Router.SIZES);
    }

    /** The size of one chunk in bytes. */
    public long size(long cid) {
        return await(single(sizeBatchAsync(new long[] {cid})));
    }

    /**
     * Stores chunks on {@code peer} under CIDs chosen by the caller, creating them (the
     * insert operation peers use for migration and recovery): one result per item. The
     * caller guarantees the CIDs route to {@code peer} (creator = {@code peer}, a local ID
     * range the peer's own allocator does not reach; see the YCSB binding's key scheme).
     */
    public CompletableFuture<List<ItemResult<Void>>> insertBatchAsync(long[] cids, byte[][] data, Durability durability) {
        checkOpen();
        int level = level(durability);
        return router.routed(cids, 0, indices -> {
            byte[][] picked = new byte[indices.length][];
            for (int i = 0; i < indices.length; i++) {
                picked[i] = data[indices[i]];
            }
            return ChunkProto.insert(level, pick(cids, indices), picked);
        }, Router.STATUSES);
    }

    /** Inserts one chunk under {@code cid} (see {@link #insertBatchAsync}). */
    public void insert(long cid, byte[] data, Durability durability) {
        checkOpen();
        int level = level(durability);
        router.single(cid, indices -> ChunkProto.insert(level, new long[] {cid}, new byte[][] {data}), Router.STATUSES);
    }

    /** Reads {@code length} bytes at {@code offset} of a chunk. */
    public CompletableFuture<byte[]> readAtAsync(long cid, long offset, long length) {
        checkOpen();
        byte[] request = ChunkProto.readAt(cid, offset, length);
        return single(router.routed(new long[] {cid}, 0, indices -> request, Router.DATA));
    }

    /** See {@link #readAtAsync}. */
    public byte[] readAt(long cid, long offset, long length) {
        return await(readAtAsync(cid, offset, length));
    }

    /** Overwrites bytes at {@code offset} of a chunk. */
    public CompletableFuture<Void> writeAtAsync(long cid, long offset, byte[] data, Durability durability) {
        checkOpen();
        byte[] request = ChunkProto.writeAt(level(durability), cid, offset, data);
        return single(router.routed(new long[] {cid}, 0, indices -> request, Router.STATUSES));
    }

    /** See {@link #writeAtAsync}. */
    public void writeAt(long cid, long offset, byte[] data, Durability durability) {
        await(writeAtAsync(cid, offset, data, durability));
    }

    /** Changes a chunk's size (keeping the common prefix, zero-filling growth). */
    public CompletableFuture<Void> resizeAsync(long cid, long size, Durability durability) {
        checkOpen();
        byte[] request = ChunkProto.resize(level(durability), cid, size);
        return single(router.routed(new long[] {cid}, 0, indices -> request, Router.STATUSES));
    }

    /** See {@link #resizeAsync}. */
    public void resize(long cid, long size, Durability durability) {
        await(resizeAsync(cid, size, durability));
    }

    /**
     * Takes a chunk's write (or read) lock for this client, waiting at most {@code wait} at
     * the owner (zero: try once); {@link MyriadException.LockTimeout} if not granted.
     */
    public CompletableFuture<Void> lockAsync(long cid, boolean write, Duration wait) {
        checkOpen();
        byte[] request = ChunkProto.lock(cid, write, wait.toMillis());
        return single(router.routed(new long[] {cid}, wait.toMillis(), indices -> request, Router.STATUSES));
    }

    /** See {@link #lockAsync}. */
    public void lock(long cid, boolean write, Duration wait) {
        await(lockAsync(cid, write, wait), wait.toMillis());
    }

    /** Releases a lock this client holds. */
    public CompletableFuture<Void> unlockAsync(long cid, boolean write) {
        checkOpen();
        byte[] request = ChunkProto.unlock(cid, write);
        return single(router.routed(new long[] {cid}, 0, indices -> request, Router.STATUSES));
    }

    /** See {@link #unlockAsync}. */
    public void unlock(long cid, boolean write) {
        await(unlockAsync(cid, write));
    }

    /**
     * The CID ranges of live chunks {@code peer} holds (of {@code creator}, -1: all), at most
     * {@code max}: pairs first, last in one array; {@code truncated[0]} says whether more
     * were left out (pass null to ignore).
     */
    public long[] list(int peer, int creator, long max, boolean[] truncated) {
        checkOpen();
        ChunkReply reply = await(router.callNode(peer, ChunkProto.list(creator, max), config.chunkTimeout.toMillis()));
        if (reply.tag != ChunkReply.RANGES) {
            throw Router.wrongReply(reply, "ranges");
        }
        if (truncated != null && truncated.length > 0) {
            truncated[0] = reply.truncated;
        }
        return reply.ranges;
    }

    /**
     * The memory summary of {@code peer}: chunks, payload bytes, used bytes, free bytes,
     * region bytes, chunks pending re-replication.
     */
    public long[] stats(int peer) {
        checkOpen();
        ChunkReply reply = await(router.callNode(peer, ChunkProto.stats(), config.chunkTimeout.toMillis()));
        if (reply.tag != ChunkReply.STATS) {
            throw Router.wrongReply(reply, "stats");
        }
        return reply.stats;
    }

    /**
     * Moves the chunks {@code first..=last} (CIDs of one creator, all on one owner) to peer
     * {@code to}; the number of chunks moved. Afterwards this client's range cache is
     * emptied, and routing finds the chunks at the new owner ("not owner" refresh).
     */
    public long migrate(long first, long last, int to) {
        checkOpen();
        if (ChunkIds.creator(first) != ChunkIds.creator(last) || Long.compareUnsigned(first, last) > 0) {
            throw new MyriadException.InvalidArgument(ChunkIds.format(first) + "..=" + ChunkIds.format(last)
                    + " is not an ascending range of one creator");
        }
        int owner = router.ownerOf(first);
        byte[] reply = await(endpoint.request(owner, io.myriad.client.net.MessageType.MIGRATE,
                ChunkProto.migrate(first, last, to)).orTimeout(60, TimeUnit.SECONDS)
                .exceptionally(error -> {
                    throw Router.translate(error, owner, 60_000);
                }), 60_000);
        String[] reason = new String[1];
        long moved = ChunkProto.decodeMigrateReply(reply, reason);
        if (moved < 0) {
            throw new MyriadException.Server(owner, reason[0]);
        }
        router.clearCache();
        return moved;
    }

    private static long[] pick(long[] cids, int[] indices) {
        if (indices.length == cids.length) {
            boolean identity = true;
            for (int i = 0; i < indices.length && identity; i++) {
                identity = indices[i] == i;
            }
            if (identity) {
                return cids;
            }
        }
        long[] out = new long[indices.length];
        for (int i = 0; i < indices.length; i++) {
            out[i] = cids[indices[i]];
        }
        return out;
    }

    // ----- nameservice -------------------------------------------------------------------------

    /** Binds {@code name} to {@code cid} (replacing an earlier binding). */
    public CompletableFuture<Void> nameRegisterAsync(String name, long cid) {
        return membership.write(MetaProto.commandNameRegister(name, cid)).thenApply(r -> null);
    }

    /** See {@link #nameRegisterAsync}. */
    public void nameRegister(String name, long cid) {
        await(nameRegisterAsync(name, cid));
    }

    /** The CID bound to {@code name}, or null. */
    public CompletableFuture<Long> nameGetAsync(String name) {
        return membership.request(MetaProto.nameGet(name), false).thenApply(reply -> {
            expect(reply, MetaReply.NAME);
            return reply.present ? reply.cid : null;
        });
    }

    /** See {@link #nameGetAsync}. */
    public Long nameGet(String name) {
        return await(nameGetAsync(name));
    }

    /** Every registered name with its CID. */
    public Map<String, Long> nameList() {
        MetaReply reply = await(membership.request(MetaProto.nameList(), false));
        expect(reply, MetaReply.NAMES);
        return reply.names;
    }

    /** Removes a name. */
    public void nameRemove(String name) {
        await(membership.write(MetaProto.commandNameRemove(name)));
    }

    // ----- barriers ----------------------------------------------------------------------------

    /** Allocates a barrier for {@code size} participants; its ID. */
    public long barrierAlloc(long size) {
        MetaResponse response = await(membership.write(MetaProto.commandBarrierAlloc(size)));
        if (response.tag != MetaResponse.BARRIER_ALLOCATED) {
            throw new MyriadException.Protocol("unexpected barrier reply tag " + response.tag);
        }
        return response.values[0];
    }

    /** A barrier's status, or null if there is no such barrier. */
    public BarrierStatus barrierStatus(long id) {
        MetaReply reply = await(membership.request(MetaProto.barrierStatus(id), false));
        expect(reply, MetaReply.BARRIER);
        return reply.barrier;
    }

    /** Changes a barrier's participant count. */
    public void barrierResize(long id, long size) {
        await(membership.write(MetaProto.commandBarrierResize(id, size)));
    }

    /** Frees a barrier. */
    public void barrierFree(long id) {
        await(membership.write(MetaProto.commandBarrierFree(id)));
    }

    /**
     * Signs on to barrier {@code id} with {@code value} and waits (at most {@code timeout})
     * until the round completes; every participant's value by node ID.
     */
    public Map<Integer, Long> barrierSignOn(long id, long value, Duration timeout) {
        long deadline = System.nanoTime() + timeout.toNanos();
        long round;
        try {
            MetaResponse response = await(membership.write(MetaProto.commandBarrierSignOn(id, nodeId(), value)));
            if (response.tag != MetaResponse.BARRIER) {
                throw new MyriadException.Protocol("barrier sign-on answered with tag " + response.tag);
            }
            if (response.released != null) {
                return response.released;
            }
            round = response.values[0];
        } catch (MyriadException.Meta e) {
            if (e.error.kind != MetaError.Kind.ALREADY_SIGNED_ON) {
                throw e;
            }
            BarrierStatus status = barrierStatus(id);
            if (status == null) {
                throw new MyriadException.Meta(new MetaError(MetaError.Kind.BARRIER_NOT_FOUND, -1, id, null));
            }
            round = status.round();
        }
        String key = id + "/" + round;
        long nextPoll = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(200);
        while (true) {
            Map<Integer, Long> values = membership.releases.remove(key);
            if (values != null) {
                return values;
            }
            long now = System.nanoTime();
            if (now >= deadline) {
                throw new MyriadException.Timeout("barrier " + id + " round " + round, timeout.toMillis());
            }
            if (now >= nextPoll) {
                nextPoll = now + TimeUnit.MILLISECONDS.toNanos(200);
                BarrierStatus status = barrierStatus(id);
                if (status == null) {
                    throw new MyriadException.Meta(new MetaError(MetaError.Kind.BARRIER_NOT_FOUND, -1, id, null));
                }
                if (status.round() == round + 1) {
                    return status.lastReleased();
                }
                if (status.round() > round + 1) {
                    throw new MyriadException.Meta(new MetaError(MetaError.Kind.INVALID_ARGUMENT, -1, -1,
                            "barrier " + id + " round " + round + " was superseded before its values were seen"));
                }
                continue;
            }
            long waitMs = Math.max(1, TimeUnit.NANOSECONDS.toMillis(Math.min(nextPoll, deadline) - now));
            synchronized (membership.releasedSignal) {
                if (!membership.releases.containsKey(key)) {
                    try {
                        membership.releasedSignal.wait(waitMs);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        throw new MyriadException("interrupted");
                    }
                }
            }
        }
    }

    // ----- temporary storage ---------------------------------------------------------------------

    /** Stores a new blob (fails with {@link MetaError.Kind#TMP_EXISTS} if the name exists). */
    public void tmpCreate(String name, byte[] data) {
        await(membership.write(MetaProto.commandTmpPut(name, data, true)));
    }

    /** Stores a blob, replacing one of the same name. */
    public void tmpPut(String name, byte[] data) {
        await(membership.write(MetaProto.commandTmpPut(name, data, false)));
    }

    /** A blob, or null if there is none of that name. */
    public byte[] tmpGet(String name) {
        MetaReply reply = await(membership.request(MetaProto.tmpGet(name), false));
        expect(reply, MetaReply.TMP);
        return reply.present ? reply.blob : null;
    }

    /** Removes a blob. */
    public void tmpRemove(String name) {
        await(membership.write(MetaProto.commandTmpRemove(name)));
    }

    /** Names and sizes of the blobs. */
    public Map<String, Long> tmpList() {
        MetaReply reply = await(membership.request(MetaProto.tmpList(), false));
        expect(reply, MetaReply.TMP_LIST);
        return reply.sizes;
    }

    // ----- shutdown --------------------------------------------------------------------------------

    /** Leaves the cluster in an orderly way (bounded wait) and closes every connection. */
    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        try {
            membership.write(MetaProto.commandLeave(nodeId())).get(2, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (ExecutionException | TimeoutException e) {
            java.util.logging.Logger.getLogger(MyriadClient.class.getName())
                    .fine("could not leave in an orderly way: " + e);
        }
        endpoint.close();
    }
}
