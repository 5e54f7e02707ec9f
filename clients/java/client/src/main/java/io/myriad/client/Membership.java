package io.myriad.client;

import io.myriad.client.net.ConnectionLostException;
import io.myriad.client.net.Endpoint;
import io.myriad.client.net.Incoming;
import io.myriad.client.net.MessageType;
import io.myriad.client.proto.MetaProto;
import io.myriad.client.proto.MetaReply;
import io.myriad.client.proto.MetaResponse;
import java.net.InetSocketAddress;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * Joining the cluster and staying in it ({@code crates/membership}): the join through the
 * superpeers under a provisional ID, the node table kept current by pushed events and
 * resyncs, heartbeat replies (so the watching superpeer keeps this client alive), barrier
 * releases, and metadata requests to the leader with failover to the other superpeers.
 * Package-private: {@link MyriadClient} is the API.
 */
final class Membership {
    private static final Logger LOG = Logger.getLogger(Membership.class.getName());
    private static final SecureRandom RANDOM = new SecureRandom();
    /** Pause before another superpeer is tried. */
    static final long RETRY_PAUSE_MS = 50;
    /** Client role code. */
    private static final int ROLE_CLIENT = 3;
    /** Provisional IDs: 0xff00..=0xffff. */
    private static final int PROVISIONAL_ID_MIN = 0xff00;

    final ClientConfig config;
    final Endpoint endpoint;
    final List<Integer> superpeerIds;
    private final Map<Integer, NodeInfo> nodes = new ConcurrentHashMap<>();
    private volatile long epoch;
    private volatile int leaderHint = -1;
    private final AtomicLong heartbeatNonce = new AtomicLong();
    private final AtomicBoolean resyncing = new AtomicBoolean();
    /** Released barrier rounds: "id/round" to values. */
    final Map<String, Map<Integer, Long>> releases = new ConcurrentHashMap<>();
    final Object releasedSignal = new Object();
    private final Executor delayed;

    Membership(ClientConfig config, Endpoint endpoint) {
        this.config = config;
        this.endpoint = endpoint;
        this.superpeerIds = new ArrayList<>(config.superpeers.keySet());
        this.delayed = CompletableFuture.delayedExecutor(RETRY_PAUSE_MS, TimeUnit.MILLISECONDS);
        endpoint.register(MessageType.HEARTBEAT, this::onHeartbeat);
        endpoint.register(MessageType.EVENT, this::onEvent);
        endpoint.register(MessageType.BARRIER_RELEASED, this::onBarrierReleased);
    }

    /** Joins: asks the superpeers (under provisional IDs) for a node ID; returns it. */
    int join() {
        InetSocketAddress listen = endpoint.listenAddress();
        String address = listen.getAddress().getHostAddress() + ":" + listen.getPort();
        byte[] request = MetaProto.joinRequest(ROLE_CLIENT, address, 7, 0, 0, -1);
        long timeoutMs = config.metaTimeout.toMillis();
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        String lastError = "no superpeer answered";
        // An answered refusal (a TLS or secret mismatch) names the cause; a later attempt
        // cut short by the deadline must not replace it with "no answer".
        boolean refused = false;
        int index = 0;
        int hint = -1;
        while (System.nanoTime() < deadline) {
            int target;
            if (hint >= 0 && config.superpeers.containsKey(hint)) {
                target = hint;
            } else {
                target = superpeerIds.get(index++ % superpeerIds.size());
            }
            hint = -1;
            int provisional = PROVISIONAL_ID_MIN | (RANDOM.nextInt() & 0xff);
            long remaining = Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime()));
            byte[] answer;
            try (Endpoint temporary = new Endpoint(provisional, config.secret, null,
                    (int) config.connectTimeout.toMillis(), config.tls)) {
                temporary.setAddress(target, config.superpeers.get(target));
                answer = temporary.request(target, MessageType.JOIN, request).get(remaining, TimeUnit.MILLISECONDS);
            } catch (ExecutionException e) {
                lastError = "superpeer " + target + ": " + e.getCause().getMessage();
                refused = true;
                pause();
                continue;
            } catch (TimeoutException e) {
                if (!refused) {
                    lastError = "superpeer " + target + ": no answer";
                }
                continue;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new MyriadException.Join("interrupted");
            }
            MetaProto.JoinReply reply = MetaProto.decodeJoinReply(answer);
            switch (reply.tag) {
                case 1:
                    endpoint.setNodeId(reply.id);
                    replaceTable(reply.epoch, reply.nodes);
                    return reply.id;
                case 2:
                    lastError = "superpeer " + target + " is not the leader";
                    if (reply.leader >= 0) {
                        hint = reply.leader;
                        continue;
                    }
                    break;
                case 3:
                    throw new MyriadException.Meta(reply.refused);
                default:
                    lastError = "superpeer " + target + ": " + reply.reason;
                    break;
            }
            pause();
        }
        throw new MyriadException.SuperpeersUnavailable("join not answered in time: " + lastError);
    }

    private static void pause() {
        try {
            Thread.sleep(RETRY_PAUSE_MS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    // ----- the node table -----------------------------------------------------------------

    long epoch() {
        return epoch;
    }

    NodeInfo node(int id) {
        return nodes.get(id);
    }

    List<NodeInfo> nodes() {
        return new ArrayList<>(nodes.values());
    }

    boolean isAlive(int node) {
        NodeInfo info = nodes.get(node);
        return info != null && info.isAlive();
    }

    /** A peer that failed or does not answer yet: a recovery may move its chunks. */
    boolean mayRecover(int node) {
        NodeInfo info = nodes.get(node);
        return info != null && info.isPeer() && info.state() != NodeInfo.LEFT;
    }

    private synchronized void replaceTable(long newEpoch, List<NodeInfo> records) {
        if (newEpoch < epoch) {
            return;
        }
        epoch = newEpoch;
        nodes.clear();
        for (NodeInfo record : records) {
            nodes.put(record.id(), record);
            syncAddress(record);
        }
    }

    private void syncAddress(NodeInfo record) {
        if (record.id() == endpoint.nodeId()) {
            return;
        }
        if (record.isAlive()) {
            try {
                endpoint.setAddress(record.id(), ClientConfig.parseAddress(record.address()));
            } catch (MyriadException e) {
                LOG.log(Level.WARNING, "node " + record.id() + " has a bad address " + record.address());
            }
        } else if (record.role() != NodeInfo.SUPERPEER) {
            endpoint.removeAddress(record.id());
        }
    }

    private void onHeartbeat(Incoming incoming) {
        long[] heartbeat;
        try {
            heartbeat = MetaProto.decodeHeartbeat(incoming.payload);
        } catch (MyriadException e) {
            LOG.log(Level.WARNING, "bad heartbeat from " + incoming.from + ": " + e.getMessage());
            return;
        }
        long mine = epoch;
        incoming.respond(MetaProto.heartbeatReply(mine, heartbeatNonce.incrementAndGet()));
        if (heartbeat[0] > mine) {
            resync();
        }
    }

    private void onEvent(Incoming incoming) {
        MetaProto.Event event;
        try {
            event = MetaProto.decodeEvent(incoming.payload);
        } catch (MyriadException e) {
            LOG.log(Level.WARNING, "bad event from " + incoming.from + ": " + e.getMessage());
            return;
        }
        if (event.tag == 4) {
            return; // ownership: routing refreshes on "not owner"
        }
        boolean gap;
        synchronized (this) {
            if (event.epoch <= epoch) {
                return;
            }
            gap = event.epoch > epoch + 1;
            if (event.tag == 1) {
                nodes.put(event.record.id(), event.record);
                syncAddress(event.record);
            } else {
                NodeInfo old = nodes.get(event.node);
                if (old != null) {
                    NodeInfo changed = new NodeInfo(old.id(), old.role(), old.address(), old.capabilities(),
                            old.rack(), old.switchId(), event.tag == 2 ? NodeInfo.FAILED : NodeInfo.LEFT,
                            event.tag == 2 ? event.epoch : 0, old.incarnation(), old.joinedEpoch(), old.released());
                    nodes.put(changed.id(), changed);
                    syncAddress(changed);
                }
            }
            epoch = event.epoch;
        }
        if (gap) {
            resync();
        }
    }

    private void onBarrierReleased(Incoming incoming) {
        try {
            MetaProto.BarrierReleased released = MetaProto.decodeBarrierReleased(incoming.payload);
            if (releases.size() >= 256) {
                releases.clear();
            }
            releases.put(released.id + "/" + released.round, released.values);
            synchronized (releasedSignal) {
                releasedSignal.notifyAll();
            }
        } catch (MyriadException e) {
            LOG.log(Level.WARNING, "bad barrier release: " + e.getMessage());
        }
    }

    /** Fetches the whole node table (once at a time), in the background. */
    void resync() {
        if (!resyncing.compareAndSet(false, true)) {
            return;
        }
        request(MetaProto.nodes(), false).whenComplete((reply, error) -> {
            try {
                if (reply != null && reply.tag == MetaReply.NODES) {
                    long newest = epoch;
                    for (NodeInfo record : reply.nodes) {
                        newest = Math.max(newest, Math.max(record.joinedEpoch(), record.failedEpoch()));
                    }
                    replaceTable(newest, reply.nodes);
                }
            } finally {
                resyncing.set(false);
            }
        });
    }

    // ----- metadata requests -----------------------------------------------------------------

    /**
     * Sends a metadata request to the leader as far as known, following "not leader"
     * answers and trying the other superpeers until the metadata timeout. A write whose
     * outcome is unknown is not retried: it fails with {@link MyriadException.Timeout}.
     */
    CompletableFuture<MetaReply> request(byte[] payload, boolean isWrite) {
        long timeoutMs = config.metaTimeout.toMillis();
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        CompletableFuture<MetaReply> result = new CompletableFuture<>();
        attempt(payload, isWrite, deadline, new int[] {0}, "no superpeer answered", result);
        return result;
    }

    private void attempt(byte[] payload, boolean isWrite, long deadline, int[] index, String lastError,
            CompletableFuture<MetaReply> result) {
        long remainingNs = deadline - System.nanoTime();
        if (remainingNs <= 0) {
            result.completeExceptionally(new MyriadException.SuperpeersUnavailable(
                    "no answer within " + config.metaTimeout.toMillis() + " ms: " + lastError));
            return;
        }
        int hint = leaderHint;
        int target = hint >= 0 ? hint : superpeerIds.get(index[0]++ % superpeerIds.size());
        endpoint.request(target, MessageType.META_REQUEST, payload)
                .orTimeout(remainingNs, TimeUnit.NANOSECONDS)
                .whenComplete((bytes, error) -> {
                    if (error != null) {
                        Throwable cause = unwrap(error);
                        forgetLeader(target);
                        if (cause instanceof TimeoutException && isWrite) {
                            result.completeExceptionally(new MyriadException.Timeout(
                                    "write to superpeer " + target + " (outcome unknown)", config.metaTimeout.toMillis()));
                            return;
                        }
                        if (cause instanceof MyriadException && !(cause instanceof MyriadException.Protocol)) {
                            result.completeExceptionally(cause);
                            return;
                        }
                        String why = "superpeer " + target + ": " + cause.getMessage();
                        delayed.execute(() -> attempt(payload, isWrite, deadline, index, why, result));
                        return;
                    }
                    MetaReply reply;
                    try {
                        reply = MetaProto.decodeReply(bytes);
                    } catch (MyriadException.Protocol e) {
                        result.completeExceptionally(new MyriadException.Protocol(
                                "reply from superpeer " + target + ": " + e.getMessage()));
                        return;
                    }
                    if (reply.tag == MetaReply.NOT_LEADER) {
                        int leader = reply.leader;
                        boolean known = leader >= 0 && leader != target && config.superpeers.containsKey(leader);
                        leaderHint = known ? leader : -1;
                        String why = "superpeer " + target + " is not the leader";
                        if (known) {
                            attempt(payload, isWrite, deadline, index, why, result);
                        } else {
                            delayed.execute(() -> attempt(payload, isWrite, deadline, index, why, result));
                        }
                    } else if (reply.tag == MetaReply.UNAVAILABLE) {
                        if (isWrite && !reply.reason.startsWith("no quorum")) {
                            result.completeExceptionally(new MyriadException.Timeout(
                                    "write on superpeer " + target + ": " + reply.reason, config.metaTimeout.toMillis()));
                            return;
                        }
                        forgetLeader(target);
                        String why = "superpeer " + target + ": " + reply.reason;
                        delayed.execute(() -> attempt(payload, isWrite, deadline, index, why, result));
                    } else {
                        if (reply.tag != MetaReply.STATUS) {
                            leaderHint = target;
                        }
                        result.complete(reply);
                    }
                });
    }

    private void forgetLeader(int target) {
        if (leaderHint == target) {
            leaderHint = -1;
        }
    }

    /** Commits a command; a refusal becomes {@link MyriadException.Meta}. */
    CompletableFuture<MetaResponse> write(byte[] command) {
        return request(MetaProto.write(command), true).thenApply(reply -> {
            if (reply.tag != MetaReply.RESPONSE) {
                throw new MyriadException.Protocol("unexpected reply tag " + reply.tag + " to a write");
            }
            if (reply.response.tag == MetaResponse.ERROR) {
                throw new MyriadException.Meta(reply.response.error);
            }
            return reply.response;
        });
    }

    /** The cause inside completion wrappers. */
    static Throwable unwrap(Throwable error) {
        Throwable cause = error;
        while ((cause instanceof CompletionException || cause instanceof ExecutionException)
                && cause.getCause() != null) {
            cause = cause.getCause();
        }
        return cause;
    }

    /** Whether an error means the node could not be reached. */
    static boolean unreachable(Throwable error) {
        return unwrap(error) instanceof ConnectionLostException;
    }
}
