package io.myriad.client.net;

import io.myriad.client.MyriadException;
import io.myriad.client.wire.Handshake;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * This client's messaging endpoint: node ID and instance, the cluster secret, one
 * connection per remote node (dialed on first use, or accepted from it), the address table
 * and the handlers of incoming types.
 *
 * <p>Connections are opened with the handshake of {@code docs/wire-format.md}: as connector
 * when this node sends first, as acceptor when a superpeer dials this node (heartbeats).
 * A dial answered {@code duplicate} uses the connection the other node opened to us.
 * With {@link Tls} every connection, dialed or accepted, runs TLS 1.3 with mutual
 * authentication first and the same handshake inside it, as the Rust endpoint does; lanes
 * are off then (the nodes refuse them under TLS). Thread-safe.
 */
public final class Endpoint implements AutoCloseable {
    private static final Logger LOG = Logger.getLogger(Endpoint.class.getName());
    private static final SecureRandom RANDOM = new SecureRandom();
    /** Largest message (same default as the Rust endpoint). */
    public static final int MESSAGE_BYTES_MAX = 256 << 20;

    private volatile int nodeId;
    private final long instance = RANDOM.nextLong();
    private final byte[] secret;
    private final Tls tls;
    private final int connectTimeoutMs;
    private final ServerSocket listener;
    private final Map<Integer, InetSocketAddress> addresses = new ConcurrentHashMap<>();
    private final Map<Integer, Connection> connections = new ConcurrentHashMap<>();
    private final Map<Integer, CompletableFuture<Connection>> dialing = new ConcurrentHashMap<>();
    private final Map<Integer, Handler> handlers = new ConcurrentHashMap<>();
    private final ExecutorService dialer;
    /** Closes sockets whose connect and handshake ran out of time (see {@link #greet}). */
    private final ScheduledThreadPoolExecutor deadlines;
    private final AtomicBoolean closed = new AtomicBoolean();

    /**
     * An endpoint under {@code nodeId} without TLS; with {@code listen} non-null it accepts
     * connections there (bound now, so its address can be announced before the ID is known).
     */
    public Endpoint(int nodeId, byte[] secret, InetSocketAddress listen, int connectTimeoutMs) {
        this(nodeId, secret, listen, connectTimeoutMs, null);
    }

    /**
     * An endpoint under {@code nodeId} whose connections all run over {@code tls} (null:
     * plain TCP); with {@code listen} non-null it accepts connections there.
     */
    public Endpoint(int nodeId, byte[] secret, InetSocketAddress listen, int connectTimeoutMs, Tls tls) {
        if (secret.length == 0 || secret.length > Handshake.SECRET_BYTES_MAX) {
            throw new MyriadException.InvalidArgument("the secret must have 1 to 1024 bytes");
        }
        this.nodeId = nodeId;
        this.secret = secret.clone();
        this.tls = tls;
        this.connectTimeoutMs = connectTimeoutMs;
        this.dialer = Executors.newCachedThreadPool(runnable -> {
            Thread thread = new Thread(runnable, "myriad-dial");
            thread.setDaemon(true);
            return thread;
        });
        this.deadlines = new ScheduledThreadPoolExecutor(1, runnable -> {
            Thread thread = new Thread(runnable, "myriad-deadline");
            thread.setDaemon(true);
            return thread;
        });
        deadlines.setRemoveOnCancelPolicy(true);
        if (listen == null) {
            listener = null;
            return;
        }
        try {
            listener = new ServerSocket();
            listener.bind(listen);
        } catch (IOException e) {
            dialer.shutdownNow();
            deadlines.shutdownNow();
            throw new MyriadException.Join("cannot listen on " + listen + ": " + e.getMessage(), e);
        }
        Thread acceptor = new Thread(this::acceptLoop, "myriad-accept");
        acceptor.setDaemon(true);
        acceptor.start();
    }

    /** Whether this endpoint's connections run over TLS. */
    public boolean isTls() {
        return tls != null;
    }

    /** This node's ID. */
    public int nodeId() {
        return nodeId;
    }

    /** Sets the node ID (once the superpeers assigned it; before any connection). */
    public void setNodeId(int id) {
        this.nodeId = id;
    }

    /** The address this endpoint accepts connections on, or null. */
    public InetSocketAddress listenAddress() {
        return listener == null ? null : (InetSocketAddress) listener.getLocalSocketAddress();
    }

    /** Registers the handler of a message type. */
    public void register(MessageType type, Handler handler) {
        handlers.put(type.key(), handler);
    }

    Handler handler(int type, int subtype) {
        return handlers.get(type << 8 | subtype);
    }

    /** Sets (or replaces) a node's address. */
    public void setAddress(int node, InetSocketAddress address) {
        InetSocketAddress old = addresses.put(node, address);
        if (old != null && !old.equals(address)) {
            closeLanes(node);
            Connection connection = connections.get(node);
            if (connection != null) {
                connection.close("address changed");
            }
        }
    }

    /** Forgets a node's address and closes its connection. */
    public void removeAddress(int node) {
        addresses.remove(node);
        closeLanes(node);
        Connection connection = connections.get(node);
        if (connection != null) {
            connection.close("node removed");
        }
    }

    /** Whether this endpoint knows where {@code node} listens. */
    public boolean hasAddress(int node) {
        return addresses.containsKey(node);
    }

    /** Sends a request to {@code node}; see {@link Connection#request}. */
    public CompletableFuture<byte[]> request(int node, MessageType type, byte[] payload) {
        Connection connection = connections.get(node);
        if (connection != null && connection.isOpen()) {
            return connection.request(type, payload);
        }
        return connection(node).thenCompose(c -> c.request(type, payload));
    }

    /** Sends a one-way message to {@code node} (best effort). */
    public CompletableFuture<Void> send(int node, MessageType type, byte[] payload) {
        return connection(node).thenAccept(c -> c.send(type, payload));
    }

    /** The connection to {@code node}, opened if needed (on a dialing thread). */
    public CompletableFuture<Connection> connection(int node) {
        Connection connection = connections.get(node);
        if (connection != null && connection.isOpen()) {
            return CompletableFuture.completedFuture(connection);
        }
        if (closed.get()) {
            return CompletableFuture.failedFuture(new MyriadException.Shutdown());
        }
        CompletableFuture<Connection> created = new CompletableFuture<>();
        CompletableFuture<Connection> existing = dialing.putIfAbsent(node, created);
        if (existing != null) {
            return existing;
        }
        try {
            dialer.execute(() -> {
                try {
                    created.complete(dial(node));
                } catch (RuntimeException e) {
                    created.completeExceptionally(e);
                } finally {
                    dialing.remove(node, created);
                }
            });
        } catch (java.util.concurrent.RejectedExecutionException e) {
            dialing.remove(node, created);
            created.completeExceptionally(new MyriadException.Shutdown());
        }
        return created;
    }

    private Connection dial(int node) {
        Connection live = connections.get(node);
        if (live != null && live.isOpen()) {
            return live;
        }
        InetSocketAddress address = addresses.get(node);
        if (address == null) {
            throw new ConnectionLostException(node, "no address known");
        }
        Socket socket = null;
        try {
            Greeted greeted = greet(address, node, connectTimeoutMs, false);
            socket = greeted.socket;
            int verdict = greeted.verdict;
            if (verdict == Handshake.ACCEPTED) {
                return register(new Connection(this, socket, node, MESSAGE_BYTES_MAX));
            }
            socket.close();
            if (verdict == Handshake.DUPLICATE) {
                return awaitIncoming(node);
            }
            throw new ConnectionLostException(node, verdict == Handshake.REFUSED ? "refused (fenced)"
                    : "bad verdict " + verdict);
        } catch (IOException | MyriadException e) {
            if (socket != null) {
                closeQuietly(socket);
            }
            throw new ConnectionLostException(node, "connect to " + address + ": " + e.getMessage());
        }
    }

    /** A socket that ran the connector's handshake, and the acceptor's verdict. */
    private static final class Greeted {
        final Socket socket;
        final int verdict;

        Greeted(Socket socket, int verdict) {
            this.socket = socket;
            this.verdict = verdict;
        }
    }

    /**
     * Connects to {@code node} and runs the connector's handshake, all within
     * {@code timeoutMs}; closes what it opened if that fails.
     *
     * <p>Without TLS no read or connect of the socket has a timeout: a deadline task closes
     * the socket if the two take too long. A JDK socket that ever connected or read with a
     * timeout stays non-blocking for good, and then every read that finds nothing costs a
     * read, a poll(2) and a read again; a connection's reader thread sleeps in one blocking
     * read(2) instead (docs/benchmarks.md, "Longer linger, blocking reads"). With TLS the
     * timeouts stay on the socket, as before.
     */
    private Greeted greet(InetSocketAddress address, int node, int timeoutMs, boolean lane) throws IOException {
        if (tls != null) {
            Socket socket = openTls(address, node, timeoutMs);
            try {
                return new Greeted(socket, handshake(socket, node, lane));
            } catch (IOException | RuntimeException e) {
                closeQuietly(socket);
                throw e;
            }
        }
        Socket socket = new Socket();
        AtomicBoolean expired = new AtomicBoolean();
        ScheduledFuture<?> deadline;
        try {
            deadline = deadlines.schedule(() -> {
                expired.set(true);
                closeQuietly(socket);
            }, timeoutMs, TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            closeQuietly(socket);
            throw new MyriadException.Shutdown();
        }
        try {
            socket.connect(address);
            socket.setTcpNoDelay(true);
            int verdict = handshake(socket, node, lane);
            if (!deadline.cancel(false)) {
                throw new SocketTimeoutException("timed out");
            }
            return new Greeted(socket, verdict);
        } catch (IOException | RuntimeException e) {
            deadline.cancel(false);
            closeQuietly(socket);
            if (expired.get()) {
                throw new SocketTimeoutException("no connection and handshake within " + timeoutMs + " ms");
            }
            throw e;
        }
    }

    /**
     * A TLS socket connected to {@code node} at {@code address} (no Nagle, reads waiting at
     * most {@code timeoutMs}), its TLS handshake done. Closes what it opened if it fails.
     */
    private Socket openTls(InetSocketAddress address, int node, int timeoutMs) throws IOException {
        Socket socket = new Socket();
        try {
            socket.connect(address, timeoutMs);
            socket.setTcpNoDelay(true);
            socket.setSoTimeout(timeoutMs);
            try {
                return tls.connect(socket, address, timeoutMs);
            } catch (javax.net.ssl.SSLException e) {
                throw new MyriadException.Protocol("TLS handshake with node " + node + " failed: " + e.getMessage()
                        + " (does its certificate come from this client's CA, and does it speak TLS?)");
            }
        } catch (IOException | RuntimeException e) {
            closeQuietly(socket);
            throw e;
        }
    }

    /**
     * Runs the connector's side of the handshake on {@code socket} (opened by
     * {@link #greet}; with the lane flag for a lane); returns the acceptor's verdict. On
     * {@link Handshake#ACCEPTED} the socket is ready for frames (no read timeout).
     */
    private int handshake(Socket socket, int node, boolean lane) throws IOException {
        OutputStream out = socket.getOutputStream();
        DataInputStream in = new DataInputStream(socket.getInputStream());
        byte[] nonce = new byte[Handshake.NONCE_BYTES];
        RANDOM.nextBytes(nonce);
        byte[] mine = new Handshake.Greeting(nodeId, instance, nonce, lane).encode();
        out.write(mine);
        out.flush();
        byte[] theirs = new byte[Handshake.GREETING_BYTES];
        try {
            in.readFully(theirs);
        } catch (java.io.EOFException | java.net.SocketException e) {
            // A node refuses a wrong secret only after its greeting: closing before it is
            // (a reset when our greeting lay unread) what a TLS-only cluster does to a
            // plaintext connector, and what a TLS node does to a certificate it refuses.
            throw new MyriadException.Protocol("node " + node + " closed the connection before its greeting: "
                    + (tls == null ? "the cluster most likely requires TLS (ClientConfig.withTlsDir, or"
                            + " -p myriad.tls.dir=DIR in YCSB)"
                            : "it refused this client's certificate (not signed by the cluster's CA?)"));
        } catch (javax.net.ssl.SSLException e) {
            // TLS 1.3: the acceptor checks the connector's certificate after the connector's
            // handshake ended; a refusal arrives as an alert on the first read.
            throw new MyriadException.Protocol("node " + node + " refused the TLS connection: " + e.getMessage()
                    + " (is this client's certificate signed by the cluster's CA?)");
        }
        Handshake.Greeting greeting = Handshake.Greeting.decode(theirs);
        if (greeting.node != node || greeting.lane) {
            throw new MyriadException.Protocol("dialed node " + node + ", answered by " + greeting.node);
        }
        byte[] proof = new byte[Handshake.PROOF_BYTES];
        in.readFully(proof);
        if (!Handshake.proofsEqual(Handshake.acceptorProof(secret, mine, theirs), proof)) {
            throw new MyriadException.Protocol("node " + node + " failed authentication (wrong secret?)");
        }
        out.write(Handshake.connectorProof(secret, mine, theirs));
        out.flush();
        int verdict = in.read();
        if (verdict == Handshake.ACCEPTED) {
            socket.setSoTimeout(0);
        }
        return verdict;
    }

    // ----- lanes -------------------------------------------------------------------------------

    /** The idle lanes of one node and how many lanes it has (idle or lent). */
    private static final class LanePool {
        final java.util.concurrent.ConcurrentLinkedDeque<Lane> idle = new java.util.concurrent.ConcurrentLinkedDeque<>();
        final java.util.concurrent.atomic.AtomicInteger count = new java.util.concurrent.atomic.AtomicInteger();
        /** Until when ({@link System#nanoTime}) no new lane is tried (the node said duplicate or failed). */
        volatile long pauseUntil;
    }

    /** Lanes per node at most (the acceptor's default {@code lanes_per_node_max}). */
    public static final int LANES_PER_NODE_MAX = 64;
    /** A lane idle this long is closed instead of reused (the wire format's default). */
    static final long LANE_IDLE_TIMEOUT_NS = TimeUnit.SECONDS.toNanos(30);
    /** How long no new lane to a node is tried after it refused one or could not be reached. */
    static final long LANE_PAUSE_NS = TimeUnit.SECONDS.toNanos(1);

    private final Map<Integer, LanePool> lanes = new ConcurrentHashMap<>();

    /**
     * A blocking request to {@code node} over a lane, written and read by the calling thread
     * ({@code docs/wire-format.md}, "Lanes"); {@code null} when no lane is to be had now (the
     * node's connection is not open yet, the node serves its maximum of lanes from us, or
     * a lane could not be opened within {@code timeoutMs}): the caller then sends over the
     * connection.
     *
     * @throws ConnectionLostException the lane broke (the node may be gone)
     * @throws java.net.SocketTimeoutException no response within {@code timeoutMs}
     * @throws MyriadException.Protocol the node answered with something else
     */
    public byte[] requestOnLane(int node, MessageType type, byte[] payload, long timeoutMs)
            throws java.net.SocketTimeoutException {
        if (type.ordered || closed.get() || tls != null) {
            return null; // under TLS every request takes the (encrypted) connection
        }
        Connection connection = connections.get(node);
        if (connection == null || !connection.isOpen()) {
            return null; // the first request to a node opens its connection, as on the Rust side
        }
        long started = System.nanoTime();
        LanePool pool = lanes.computeIfAbsent(node, n -> new LanePool());
        Lane lane = takeLane(node, pool, timeoutMs);
        if (lane == null) {
            return null;
        }
        try {
            long leftMs = timeoutMs - TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
            byte[] response = lane.call(type, payload, Math.max(1, leftMs));
            pool.idle.offerFirst(lane);
            if (closed.get()) {
                closeLanes(node);
            }
            return response;
        } catch (java.net.SocketTimeoutException e) {
            pool.count.decrementAndGet();
            throw e;
        } catch (IOException e) {
            pool.count.decrementAndGet();
            throw new ConnectionLostException(node, "lane: " + e.getMessage());
        } catch (RuntimeException e) {
            pool.count.decrementAndGet();
            throw e;
        }
    }

    private Lane takeLane(int node, LanePool pool, long timeoutMs) {
        Lane lane;
        while ((lane = pool.idle.pollFirst()) != null) {
            if (System.nanoTime() - lane.idleSince < LANE_IDLE_TIMEOUT_NS && lane.reusable()) {
                return lane;
            }
            lane.close();
            pool.count.decrementAndGet();
        }
        if (System.nanoTime() < pool.pauseUntil) {
            return null;
        }
        if (pool.count.incrementAndGet() > LANES_PER_NODE_MAX) {
            pool.count.decrementAndGet();
            return null;
        }
        Lane opened = openLane(node, (int) Math.max(1, Math.min(connectTimeoutMs, timeoutMs)));
        if (opened == null) {
            pool.count.decrementAndGet();
            pool.pauseUntil = System.nanoTime() + LANE_PAUSE_NS;
        }
        return opened;
    }

    /**
     * A new lane to {@code node}, or null if the node refused it or did not complete the
     * handshake within {@code timeoutMs}.
     */
    private Lane openLane(int node, int timeoutMs) {
        InetSocketAddress address = addresses.get(node);
        if (address == null) {
            return null;
        }
        Socket socket = null;
        try {
            Greeted greeted = greet(address, node, timeoutMs, true);
            socket = greeted.socket;
            if (greeted.verdict == Handshake.ACCEPTED) {
                return new Lane(node, socket, MESSAGE_BYTES_MAX);
            }
        } catch (IOException | MyriadException e) {
            LOG.log(Level.FINE, "lane to node " + node + " failed: " + e.getMessage());
        }
        if (socket != null) {
            closeQuietly(socket);
        }
        return null;
    }

    /** Lanes open to {@code node} (idle or lent to a call). */
    public int laneCount(int node) {
        LanePool pool = lanes.get(node);
        return pool == null ? 0 : pool.count.get();
    }

    /** Closes the idle lanes of {@code node} (lent ones close when their call ends). */
    private void closeLanes(int node) {
        LanePool pool = lanes.get(node);
        if (pool == null) {
            return;
        }
        Lane lane;
        while ((lane = pool.idle.pollFirst()) != null) {
            lane.close();
            pool.count.decrementAndGet();
        }
    }

    /** After a {@code duplicate} verdict: the connection the other node opened to us. */
    private Connection awaitIncoming(int node) {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(connectTimeoutMs);
        while (System.nanoTime() < deadline) {
            Connection connection = connections.get(node);
            if (connection != null && connection.isOpen()) {
                return connection;
            }
            try {
                Thread.sleep(5);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                break;
            }
        }
        throw new ConnectionLostException(node, "duplicate connection never arrived");
    }

    private Connection register(Connection connection) {
        if (closed.get()) {
            connection.close("endpoint closed");
            throw new MyriadException.Shutdown();
        }
        Connection old = connections.put(connection.remoteNode, connection);
        connection.start();
        if (old != null && old != connection && !old.isOpen()) {
            LOG.log(Level.FINE, "replaced a closed connection to " + connection.remoteNode);
        }
        return connection;
    }

    private void acceptLoop() {
        while (!closed.get()) {
            Socket socket;
            try {
                socket = listener.accept();
            } catch (IOException e) {
                if (!closed.get()) {
                    LOG.log(Level.WARNING, "accept failed: " + e.getMessage());
                }
                return;
            }
            try {
                dialer.execute(() -> accept(socket));
            } catch (java.util.concurrent.RejectedExecutionException e) {
                closeQuietly(socket);
            }
        }
    }

    private void accept(Socket accepted) {
        Socket socket = accepted;
        try {
            socket.setTcpNoDelay(true);
            socket.setSoTimeout(connectTimeoutMs);
            if (tls != null) {
                socket = tls.accept(accepted, connectTimeoutMs);
            }
            DataInputStream in = new DataInputStream(socket.getInputStream());
            OutputStream out = socket.getOutputStream();
            byte[] theirs = new byte[Handshake.GREETING_BYTES];
            in.readFully(theirs);
            Handshake.Greeting greeting = Handshake.Greeting.decode(theirs);
            if (greeting.node == nodeId || greeting.lane) {
                closeQuietly(socket);
                return;
            }
            byte[] nonce = new byte[Handshake.NONCE_BYTES];
            RANDOM.nextBytes(nonce);
            byte[] mine = new Handshake.Greeting(nodeId, instance, nonce, false).encode();
            out.write(mine);
            out.write(Handshake.acceptorProof(secret, theirs, mine));
            out.flush();
            byte[] proof = new byte[Handshake.PROOF_BYTES];
            in.readFully(proof);
            if (!Handshake.proofsEqual(Handshake.connectorProof(secret, theirs, mine), proof)) {
                LOG.log(Level.WARNING, "node " + greeting.node + " failed authentication");
                closeQuietly(socket);
                return;
            }
            out.write(Handshake.ACCEPTED);
            out.flush();
            socket.setSoTimeout(0);
            register(new Connection(this, socket, greeting.node, MESSAGE_BYTES_MAX));
        } catch (SocketTimeoutException e) {
            closeQuietly(socket);
        } catch (IOException | RuntimeException e) {
            LOG.log(Level.FINE, "handshake failed: " + e.getMessage());
            closeQuietly(socket);
        }
    }

    private static void closeQuietly(Socket socket) {
        try {
            socket.close();
        } catch (IOException ignored) {
            // nothing to do
        }
    }

    void closed(Connection connection) {
        connections.remove(connection.remoteNode, connection);
    }

    /** Closes the listener and every connection. */
    @Override
    public void close() {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        if (listener != null) {
            try {
                listener.close();
            } catch (IOException ignored) {
                // closing anyway
            }
        }
        for (Integer node : lanes.keySet()) {
            closeLanes(node);
        }
        List<Connection> all = new ArrayList<>(connections.values());
        for (Connection connection : all) {
            connection.close("endpoint closed");
        }
        dialer.shutdownNow();
        deadlines.shutdownNow();
    }
}
