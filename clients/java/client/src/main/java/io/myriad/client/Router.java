package io.myriad.client;

import io.myriad.client.net.Endpoint;
import io.myriad.client.net.MessageType;
import io.myriad.client.proto.ChunkProto;
import io.myriad.client.proto.ChunkReply;
import io.myriad.client.proto.ItemError;
import io.myriad.client.proto.MetaProto;
import io.myriad.client.proto.MetaReply;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentSkipListMap;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Function;

/**
 * Chunk routing, as {@code crates/client/src/chunk.rs}: a CID goes to the cached lookup
 * range holding it, else to its creator. A peer answering "not owner" makes the client look
 * the CID up at the superpeers, cache the range and try again; an unreachable owner gets
 * one lookup refresh, and while the node table says a recovery may move its chunks the
 * call keeps looking them up every {@link #RECOVERY_POLL_MS} until its timeout. A batch is
 * split per owner, the parts travel concurrently, results come back in the caller's order.
 * After {@code attemptsMax} quick rounds further rounds are paced, until the timeout.
 */
final class Router {
    /** Pause between paced rounds. */
    static final long RECOVERY_POLL_MS = 30;
    /** Items of one creator needing a refresh from which all its ranges are fetched at once. */
    static final int LOOKUP_ALL_ITEMS_MIN = 8;
    /** Most cached ranges per creator. */
    static final int CACHED_RANGES_MAX = 4096;
    private static final long ROUND_TIME_MIN_NS = TimeUnit.MILLISECONDS.toNanos(5);

    private final Membership membership;
    private final Endpoint endpoint;
    private final ClientConfig config;
    private final Map<Integer, ConcurrentSkipListMap<Long, long[]>> cache = new ConcurrentHashMap<>();
    private final Executor paced = CompletableFuture.delayedExecutor(RECOVERY_POLL_MS, TimeUnit.MILLISECONDS);

    Router(Membership membership, Endpoint endpoint, ClientConfig config) {
        this.membership = membership;
        this.endpoint = endpoint;
        this.config = config;
    }

    /** Per-item outcome of a reply: values (any, null allowed) or errors. */
    static final class Parsed {
        final Object[] values;
        final ItemError[] errors;

        Parsed(Object[] values, ItemError[] errors) {
            this.values = values;
            this.errors = errors;
        }
    }

    /** Splits a reply into per-item outcomes; throws {@link MyriadException.Protocol}. */
    interface Parser {
        Parsed parse(ChunkReply reply, int count);
    }

    static MyriadException wrongReply(ChunkReply reply, String expected) {
        if (reply.tag == ChunkReply.MALFORMED) {
            return new MyriadException.Protocol("the peer could not decode the request: " + reply.malformed);
        }
        return new MyriadException.Protocol("expected a " + expected + " reply, got tag " + reply.tag);
    }

    private static Parsed failedAll(ItemError error, int count) {
        ItemError[] errors = new ItemError[count];
        java.util.Arrays.fill(errors, error);
        return new Parsed(new Object[count], errors);
    }

    private static void checkCount(int got, int count) {
        if (got != count) {
            throw new MyriadException.Protocol("reply has " + got + " items for " + count + " requested");
        }
    }

    static final Parser DATA = (reply, count) -> {
        if (reply.tag == ChunkReply.FAILED) {
            return failedAll(reply.failed, count);
        }
        if (reply.tag != ChunkReply.DATA) {
            throw wrongReply(reply, "data");
        }
        checkCount(reply.data.length, count);
        return new Parsed(reply.data, reply.errors);
    };

    static final Parser STATUSES = (reply, count) -> {
        if (reply.tag == ChunkReply.FAILED) {
            return failedAll(reply.failed, count);
        }
        if (reply.tag != ChunkReply.STATUSES) {
            throw wrongReply(reply, "status");
        }
        checkCount(reply.errors.length, count);
        return new Parsed(new Object[count], reply.errors);
    };

    static final Parser SIZES = (reply, count) -> {
        if (reply.tag == ChunkReply.FAILED) {
            return failedAll(reply.failed, count);
        }
        if (reply.tag != ChunkReply.SIZES) {
            throw wrongReply(reply, "size");
        }
        checkCount(reply.sizes.length, count);
        Object[] values = new Object[count];
        for (int i = 0; i < count; i++) {
            values[i] = reply.sizes[i];
        }
        return new Parsed(values, reply.errors);
    };

    /** The client error of an item error from {@code node} about {@code cid}. */
    static MyriadException itemFailure(ItemError error, long cid, int node) {
        switch (error.code) {
            case ItemError.NOT_FOUND:
                return new MyriadException.NotFound(cid);
            case ItemError.NOT_OWNER:
                return new MyriadException.Server(node, "ownership of chunk " + ChunkIds.format(cid) + " kept moving");
            case ItemError.TOO_LARGE:
                return new MyriadException.OutOfSpace(node, "larger than a chunk may be");
            case ItemError.OUT_OF_MEMORY:
                return new MyriadException.OutOfSpace(node, "out of memory");
            case ItemError.LOCK_TIMEOUT:
                return new MyriadException.LockTimeout(cid);
            case ItemError.INVALID:
                return new MyriadException.InvalidArgument("node " + ChunkIds.formatNode(node) + " refused chunk "
                        + ChunkIds.format(cid) + ": " + error.text);
            default:
                return new MyriadException.Server(node, error.text);
        }
    }

    // ----- the range cache ------------------------------------------------------------------

    /** The node {@code cid} is sent to: the cached range holding it, else its creator. */
    int ownerOf(long cid) {
        int creator = ChunkIds.creator(cid);
        long local = ChunkIds.localId(cid);
        ConcurrentSkipListMap<Long, long[]> ranges = cache.get(creator);
        if (ranges != null) {
            Map.Entry<Long, long[]> entry = ranges.floorEntry(local);
            if (entry != null && local <= entry.getValue()[0]) {
                return (int) entry.getValue()[1];
            }
        }
        return creator;
    }

    /** Caches a range, replacing the cached ranges it overlaps. */
    void remember(int creator, long first, long last, int owner) {
        if (first > last) {
            return;
        }
        ConcurrentSkipListMap<Long, long[]> ranges = cache.computeIfAbsent(creator, c -> new ConcurrentSkipListMap<>());
        synchronized (ranges) {
            Map.Entry<Long, long[]> before = ranges.floorEntry(first);
            if (before != null && before.getValue()[0] >= first) {
                ranges.remove(before.getKey());
            }
            ranges.subMap(first, true, last, true).clear();
            if (ranges.size() >= CACHED_RANGES_MAX) {
                ranges.clear();
            }
            ranges.put(first, new long[] {last, owner});
        }
    }

    /** Forgets every cached range. */
    void clearCache() {
        cache.clear();
    }

    // ----- one request to a named node -----------------------------------------------------

    /** One request to {@code node} (not routed by CID), with the call's timeout. */
    CompletableFuture<ChunkReply> callNode(int node, byte[] request, long timeoutMs) {
        if (!membership.isAlive(node)) {
            return CompletableFuture.failedFuture(new MyriadException.NodeUnavailable(node));
        }
        return endpoint.request(node, MessageType.CHUNK, request)
                .orTimeout(timeoutMs, TimeUnit.MILLISECONDS)
                .handle((bytes, error) -> {
                    if (error != null) {
                        throw translate(error, node, timeoutMs);
                    }
                    ChunkReply reply = decode(bytes, node);
                    if (reply.tag == ChunkReply.MALFORMED) {
                        throw new MyriadException.Protocol("node " + node + " could not decode the request: "
                                + reply.malformed);
                    }
                    return reply;
                });
    }

    private static ChunkReply decode(byte[] bytes, int node) {
        try {
            return ChunkProto.decodeReply(bytes);
        } catch (MyriadException.Protocol e) {
            throw new MyriadException.Protocol("undecodable reply from node " + node + ": " + e.getMessage());
        }
    }

    static MyriadException translate(Throwable error, int node, long timeoutMs) {
        Throwable cause = Membership.unwrap(error);
        if (cause instanceof TimeoutException) {
            return new MyriadException.Timeout("chunk request to node " + ChunkIds.formatNode(node), timeoutMs);
        }
        if (cause instanceof MyriadException) {
            return (MyriadException) cause;
        }
        return new MyriadException.NodeUnavailable(node);
    }

    // ----- one item, blocking ---------------------------------------------------------------

    private static final int[] FIRST = {0};

    /**
     * A blocking call about one CID, on the calling thread (as the Rust client sends its
     * blocking calls): the request goes to the cached owner over a lane of the endpoint
     * (written and read by this thread; the node's connection when no lane is to be had),
     * and this thread decodes the reply, with no timer, no round state and no callbacks on
     * a connection's reader thread. An answer other than a final one ("not owner", an
     * owner that is not alive or not reachable) hands the item to {@link #routed} with the
     * time left, which looks it up and tries again. Returns the item's value (null for
     * status replies) or throws the call's {@link MyriadException}.
     */
    Object single(long cid, Function<int[], byte[]> build, Parser parser) {
        long timeoutMs = config.chunkTimeout.toMillis();
        long started = System.nanoTime();
        int owner = ownerOf(cid);
        if (membership.isAlive(owner)) {
            byte[] request = build.apply(FIRST);
            byte[] bytes = null;
            try {
                bytes = config.lanes ? endpoint.requestOnLane(owner, MessageType.CHUNK, request, timeoutMs) : null;
            } catch (java.net.SocketTimeoutException e) {
                throw new MyriadException.Timeout("chunk request to node " + ChunkIds.formatNode(owner), timeoutMs);
            } catch (io.myriad.client.net.ConnectionLostException e) {
                bytes = null; // the lane broke: the connection path below decides
            }
            long leftMs = timeoutMs - TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
            if (bytes == null && leftMs <= 0) {
                throw new MyriadException.Timeout("chunk request to node " + ChunkIds.formatNode(owner), timeoutMs);
            }
            CompletableFuture<byte[]> sent = bytes != null ? CompletableFuture.completedFuture(bytes)
                    : endpoint.request(owner, MessageType.CHUNK, request);
            try {
                bytes = sent.get(Math.max(1, leftMs), TimeUnit.MILLISECONDS);
            } catch (TimeoutException e) {
                // Frees the request's slot on the connection, as the routed path's timer does.
                sent.completeExceptionally(e);
                throw translate(e, owner, timeoutMs);
            } catch (java.util.concurrent.ExecutionException e) {
                if (!Membership.unreachable(e.getCause())) {
                    throw translate(e.getCause(), owner, timeoutMs);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new MyriadException("interrupted");
            }
            if (bytes != null) {
                Parsed parsed = parser.parse(decode(bytes, owner), 1);
                ItemError error = parsed.errors[0];
                if (error == null) {
                    return parsed.values[0];
                }
                if (error.code != ItemError.NOT_OWNER) {
                    throw itemFailure(error, cid, owner);
                }
            }
        }
        long spentMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
        List<ItemResult<Object>> results;
        try {
            results = this.<Object>routed(new long[] {cid}, -Math.min(spentMs, timeoutMs - 1), build, parser)
                    .get(timeoutMs + 5_000, TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            throw new MyriadException.Timeout("chunk call", timeoutMs);
        } catch (java.util.concurrent.ExecutionException e) {
            Throwable cause = Membership.unwrap(e);
            throw cause instanceof MyriadException ? (MyriadException) cause
                    : new MyriadException("call failed: " + cause, cause);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new MyriadException("interrupted");
        }
        if (results.size() != 1) {
            throw new MyriadException.Protocol("no result for the item");
        }
        return results.get(0).get();
    }

    // ----- routed calls -------------------------------------------------------------------

    /**
     * Routes items (one CID each) to their owners until each has a final result;
     * {@code build} makes the request for the items at the given indices (in that order).
     */
    <T> CompletableFuture<List<ItemResult<T>>> routed(long[] cids, long extraWaitMs, Function<int[], byte[]> build,
            Parser parser) {
        long timeoutMs = config.chunkTimeout.toMillis() + extraWaitMs;
        Call<T> call = new Call<>(cids, build, parser, System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs),
                timeoutMs);
        call.round();
        return call.result;
    }

    /** The state of one routed call. */
    private final class Call<T> {
        final long[] cids;
        final Function<int[], byte[]> build;
        final Parser parser;
        final long deadline;
        final long timeoutMs;
        final Object[] values;
        final MyriadException[] errors;
        final boolean[] done;
        final boolean[] refreshed;
        final int[] waitingOn;
        final int[] refusedBy;
        /** The node whose last answer for an item was "not owner" (kept across rounds). */
        final int[] lastRefusal;
        final int[] lastOwner;
        int rounds;
        final CompletableFuture<List<ItemResult<T>>> result = new CompletableFuture<>();

        Call(long[] cids, Function<int[], byte[]> build, Parser parser, long deadline, long timeoutMs) {
            this.cids = cids;
            this.build = build;
            this.parser = parser;
            this.deadline = deadline;
            this.timeoutMs = timeoutMs;
            int n = cids.length;
            values = new Object[n];
            errors = new MyriadException[n];
            done = new boolean[n];
            refreshed = new boolean[n];
            waitingOn = new int[n];
            refusedBy = new int[n];
            lastRefusal = new int[n];
            lastOwner = new int[n];
            java.util.Arrays.fill(waitingOn, -1);
            java.util.Arrays.fill(refusedBy, -1);
            java.util.Arrays.fill(lastRefusal, -1);
        }

        void finish(int index, Object value, MyriadException error) {
            done[index] = true;
            values[index] = value;
            errors[index] = error;
        }

        @SuppressWarnings("unchecked")
        void complete() {
            List<ItemResult<T>> out = new ArrayList<>(cids.length);
            for (int i = 0; i < cids.length; i++) {
                if (!done[i]) {
                    out.add(ItemResult.failed(waitingOn[i] >= 0 ? new MyriadException.NodeUnavailable(waitingOn[i])
                            : itemFailure(new ItemError(ItemError.NOT_OWNER, null), cids[i], lastOwner[i])));
                } else if (errors[i] != null) {
                    out.add(ItemResult.failed(errors[i]));
                } else {
                    out.add(ItemResult.ok((T) values[i]));
                }
            }
            result.complete(out);
        }

        void round() {
            try {
                roundUnchecked();
            } catch (RuntimeException e) {
                result.completeExceptionally(e);
            }
        }

        private void roundUnchecked() {
            List<Integer> pending = new ArrayList<>();
            for (int i = 0; i < cids.length; i++) {
                if (!done[i]) {
                    pending.add(i);
                }
            }
            if (pending.isEmpty() || (rounds > 0 && deadline - System.nanoTime() < ROUND_TIME_MIN_NS)) {
                complete();
                return;
            }
            rounds++;
            Map<Integer, List<Integer>> groups = new LinkedHashMap<>();
            for (int index : pending) {
                int owner = ownerOf(cids[index]);
                lastOwner[index] = owner;
                groups.computeIfAbsent(owner, o -> new ArrayList<>()).add(index);
            }
            List<CompletableFuture<Void>> parts = new ArrayList<>(groups.size());
            List<Integer> toRefresh = java.util.Collections.synchronizedList(new ArrayList<>());
            for (Map.Entry<Integer, List<Integer>> group : groups.entrySet()) {
                int owner = group.getKey();
                int[] indices = group.getValue().stream().mapToInt(Integer::intValue).toArray();
                CompletableFuture<byte[]> sent;
                long remaining = deadline - System.nanoTime();
                if (!membership.isAlive(owner)) {
                    sent = CompletableFuture.failedFuture(new io.myriad.client.net.ConnectionLostException(owner, "not alive"));
                } else if (remaining <= 0) {
                    sent = CompletableFuture.failedFuture(new TimeoutException());
                } else {
                    sent = endpoint.request(owner, MessageType.CHUNK, build.apply(indices))
                            .orTimeout(remaining, TimeUnit.NANOSECONDS);
                }
                parts.add(sent.handle((bytes, error) -> {
                    absorb(owner, indices, bytes, error, toRefresh);
                    return null;
                }));
            }
            CompletableFuture.allOf(parts.toArray(new CompletableFuture<?>[0]))
                    .thenCompose(ignored -> refresh(new ArrayList<>(toRefresh)))
                    .whenComplete((ignored, error) -> {
                        if (error != null) {
                            result.completeExceptionally(Membership.unwrap(error));
                        } else {
                            next();
                        }
                    });
        }

        /** Takes the outcome of the part sent to {@code owner}. */
        private synchronized void absorb(int owner, int[] indices, byte[] bytes, Throwable error, List<Integer> toRefresh) {
            if (error != null) {
                if (Membership.unreachable(error)) {
                    boolean recovering = membership.mayRecover(owner);
                    for (int index : indices) {
                        if (recovering) {
                            waitingOn[index] = owner;
                            toRefresh.add(index);
                        } else if (refreshed[index]) {
                            finish(index, null, new MyriadException.NodeUnavailable(owner));
                        } else {
                            refreshed[index] = true;
                            toRefresh.add(index);
                        }
                    }
                    return;
                }
                MyriadException failure = translate(error, owner, timeoutMs);
                for (int index : indices) {
                    if (failure instanceof MyriadException.Timeout && lastRefusal[index] == owner) {
                        continue; // the refusal is the last real answer
                    }
                    finish(index, null, failure);
                }
                return;
            }
            Parsed parsed;
            try {
                parsed = parser.parse(decode(bytes, owner), indices.length);
            } catch (MyriadException e) {
                for (int index : indices) {
                    finish(index, null, e);
                }
                return;
            }
            for (int k = 0; k < indices.length; k++) {
                int index = indices[k];
                ItemError itemError = parsed.errors[k];
                if (itemError == null) {
                    finish(index, parsed.values[k], null);
                } else if (itemError.code == ItemError.NOT_OWNER) {
                    refusedBy[index] = owner;
                    lastRefusal[index] = owner;
                    toRefresh.add(index);
                } else {
                    finish(index, null, itemFailure(itemError, cids[index], owner));
                }
            }
        }

        /** Looks the items up again (one range answer covers many items). */
        private CompletableFuture<Void> refresh(List<Integer> toRefresh) {
            if (toRefresh.isEmpty()) {
                return CompletableFuture.completedFuture(null);
            }
            Map<Integer, Integer> perCreator = new HashMap<>();
            for (int index : toRefresh) {
                perCreator.merge(ChunkIds.creator(cids[index]), 1, Integer::sum);
            }
            CompletableFuture<Void> chain = CompletableFuture.completedFuture(null);
            List<long[]> fetched = java.util.Collections.synchronizedList(new ArrayList<>());
            for (Map.Entry<Integer, Integer> entry : perCreator.entrySet()) {
                if (entry.getValue() >= LOOKUP_ALL_ITEMS_MIN) {
                    int creator = entry.getKey();
                    chain = chain.thenCompose(ignored -> lookupAll(creator, fetched));
                }
            }
            for (int index : toRefresh) {
                chain = chain.thenCompose(ignored -> lookupOne(index, fetched));
            }
            return chain;
        }

        private CompletableFuture<Void> lookupAll(int creator, List<long[]> fetched) {
            return membership.request(MetaProto.lookupTree(creator), false).handle((reply, error) -> {
                if (error == null && reply.tag == MetaReply.LOOKUP_TREE) {
                    for (long[] range : fullRanges(creator, reply.ranges)) {
                        remember(creator, range[1], range[2], (int) range[3]);
                        fetched.add(range);
                    }
                }
                return null;
            });
        }

        private CompletableFuture<Void> lookupOne(int index, List<long[]> fetched) {
            long cid = cids[index];
            int creator = ChunkIds.creator(cid);
            long local = ChunkIds.localId(cid);
            synchronized (fetched) {
                for (long[] range : fetched) {
                    if (range[0] == creator && range[1] <= local && local <= range[2]) {
                        return CompletableFuture.completedFuture(null);
                    }
                }
            }
            long remaining = deadline - System.nanoTime();
            if (remaining <= 0) {
                synchronized (this) {
                    finish(index, null, new MyriadException.Timeout("lookup of chunk " + ChunkIds.format(cid), timeoutMs));
                }
                return CompletableFuture.completedFuture(null);
            }
            return membership.request(MetaProto.lookup(cid), false)
                    .orTimeout(remaining, TimeUnit.NANOSECONDS)
                    .handle((reply, error) -> {
                        synchronized (this) {
                            if (error != null) {
                                Throwable cause = Membership.unwrap(error);
                                finish(index, null, cause instanceof MyriadException ? (MyriadException) cause
                                        : new MyriadException.Timeout("lookup of chunk " + ChunkIds.format(cid), timeoutMs));
                            } else if (reply.tag != MetaReply.LOOKUP) {
                                finish(index, null, new MyriadException.Protocol("unexpected reply to a lookup"));
                            } else {
                                long[] l = reply.lookup;
                                remember((int) l[0], l[1], l[2], (int) l[3]);
                                fetched.add(l);
                            }
                        }
                        return null;
                    });
        }

        /** Starts the next round now or after a pause. */
        private void next() {
            boolean wait = false;
            synchronized (this) {
                for (int i = 0; i < cids.length; i++) {
                    if (done[i]) {
                        continue;
                    }
                    if (waitingOn[i] >= 0) {
                        if (ownerOf(cids[i]) != waitingOn[i]) {
                            waitingOn[i] = -1;
                        } else if (System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(RECOVERY_POLL_MS) >= deadline) {
                            finish(i, null, new MyriadException.NodeUnavailable(waitingOn[i]));
                        } else {
                            wait = true;
                        }
                    }
                    if (refusedBy[i] >= 0 && ownerOf(cids[i]) == refusedBy[i]
                            && System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(RECOVERY_POLL_MS) < deadline) {
                        wait = true;
                    }
                    refusedBy[i] = -1;
                }
            }
            if (wait) {
                rounds--;
            }
            if (wait || rounds >= config.attemptsMax) {
                if (System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(RECOVERY_POLL_MS) >= deadline) {
                    complete();
                    return;
                }
                paced.execute(this::round);
            } else {
                round();
            }
        }
    }

    /**
     * Every range of {@code creator} given the moved ones ({@code moved} = first, last, owner
     * triples): the moved ranges plus the gaps, which the creator holds. Each result is
     * {creator, first, last, owner}.
     */
    static List<long[]> fullRanges(int creator, long[] moved) {
        List<long[]> sorted = new ArrayList<>();
        for (int i = 0; i + 2 < moved.length; i += 3) {
            sorted.add(new long[] {moved[i], moved[i + 1], moved[i + 2]});
        }
        sorted.sort((a, b) -> Long.compareUnsigned(a[0], b[0]));
        List<long[]> out = new ArrayList<>();
        long next = 0;
        for (long[] range : sorted) {
            if (range[0] > range[1] || range[0] < next || range[1] > ChunkIds.LOCAL_ID_MAX) {
                continue;
            }
            if (range[0] > next) {
                out.add(new long[] {creator, next, range[0] - 1, creator});
            }
            out.add(new long[] {creator, range[0], range[1], range[2]});
            next = range[1] + 1;
        }
        if (next <= ChunkIds.LOCAL_ID_MAX) {
            out.add(new long[] {creator, next, ChunkIds.LOCAL_ID_MAX, creator});
        }
        return out;
    }
}
