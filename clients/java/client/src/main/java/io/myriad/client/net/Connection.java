package io.myriad.client.net;

import io.myriad.client.MyriadException;
import io.myriad.client.wire.Frame;
import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.Socket;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.ReentrantLock;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * One authenticated TCP connection to another node, after the handshake. Sending threads
 * queue their frames and the one that gets the write lock writes everything queued in one
 * go (flat combining: many small frames share a socket write, and no hand-off to a writer
 * thread); a reader thread cuts frames, reassembles fragments, completes pending requests
 * by message ID and hands requests and messages to the endpoint's handlers.
 *
 * <p>Invariants: any number of threads may send at once, with up to
 * {@link #PENDING_MAX} requests in flight; a fragmented message is queued as one unit, so
 * fragments of two messages never interleave; anything malformed from the other side
 * closes the connection (its pending requests fail with {@link ConnectionLostException}),
 * never the client.
 */
public final class Connection {
    private static final Logger LOG = Logger.getLogger(Connection.class.getName());
    /** Most requests in flight on one connection. */
    public static final int PENDING_MAX = 65_536;

    final int remoteNode;
    private final Endpoint endpoint;
    private final Socket socket;
    private final ConcurrentHashMap<Integer, CompletableFuture<byte[]>> pending = new ConcurrentHashMap<>();
    private final AtomicInteger nextId = new AtomicInteger(1);
    private final ConcurrentLinkedQueue<byte[]> queue = new ConcurrentLinkedQueue<>();
    private final ReentrantLock writeLock = new ReentrantLock();
    /** Created with the connection: it is visible to senders as soon as it is registered. */
    private final OutputStream out;
    private final AtomicBoolean closed = new AtomicBoolean();
    private final int messageBytesMax;

    Connection(Endpoint endpoint, Socket socket, int remoteNode, int messageBytesMax) throws IOException {
        this.endpoint = endpoint;
        this.socket = socket;
        this.remoteNode = remoteNode;
        this.messageBytesMax = messageBytesMax;
        this.out = new BufferedOutputStream(socket.getOutputStream(), 64 * 1024);
    }

    /** Starts the reader thread (after the endpoint registered the connection). */
    void start() {
        Thread reader = new Thread(this::readLoop, "myriad-read-" + remoteNode);
        reader.setDaemon(true);
        reader.start();
    }

    /** The node at the other end. */
    public int remoteNode() {
        return remoteNode;
    }

    /** Whether the connection is still open. */
    public boolean isOpen() {
        return !closed.get();
    }

    /** Requests waiting for their response. */
    public int pendingCount() {
        return pending.size();
    }

    private int newId() {
        while (true) {
            int id = nextId.getAndIncrement();
            if (id != 0 && !pending.containsKey(id)) {
                return id;
            }
        }
    }

    /** Encodes a message as one frame or as fragments, all in one byte array. */
    static byte[] frames(int kind, boolean ordered, int type, int subtype, int id, byte[] payload) {
        int max = Frame.PAYLOAD_BYTES_MAX;
        if (payload.length <= max) {
            byte[] out = new byte[Frame.HEADER_BYTES + payload.length];
            new Frame(kind, ordered, Frame.WHOLE, type, subtype, id, payload.length).encode(out, 0);
            System.arraycopy(payload, 0, out, Frame.HEADER_BYTES, payload.length);
            return out;
        }
        int pieces = (payload.length + max - 1) / max;
        byte[] out = new byte[payload.length + pieces * Frame.HEADER_BYTES];
        int at = 0;
        for (int piece = 0; piece < pieces; piece++) {
            int from = piece * max;
            int length = Math.min(max, payload.length - from);
            int fragment = piece + 1 == pieces ? Frame.LAST : Frame.MORE;
            new Frame(kind, ordered, fragment, type, subtype, id, length).encode(out, at);
            System.arraycopy(payload, from, out, at + Frame.HEADER_BYTES, length);
            at += Frame.HEADER_BYTES + length;
        }
        return out;
    }

    /**
     * Sends a request; the future completes with the response payload, or exceptionally with
     * {@link ConnectionLostException} or {@link MyriadException}.
     */
    public CompletableFuture<byte[]> request(MessageType type, byte[] payload) {
        CompletableFuture<byte[]> future = new CompletableFuture<>();
        if (payload.length > messageBytesMax) {
            future.completeExceptionally(new MyriadException.InvalidArgument(
                    "request of " + payload.length + " bytes exceeds the message limit of " + messageBytesMax));
            return future;
        }
        if (pending.size() >= PENDING_MAX) {
            future.completeExceptionally(new MyriadException.Server(remoteNode, "too many pending requests"));
            return future;
        }
        int id = newId();
        pending.put(id, future);
        future.whenComplete((bytes, error) -> pending.remove(id, future));
        enqueue(frames(Frame.KIND_REQUEST, type.ordered, type.type, type.subtype, id, payload));
        if (closed.get()) {
            future.completeExceptionally(new ConnectionLostException(remoteNode, "connection closed"));
        }
        return future;
    }

    /** Sends a one-way message. */
    public void send(MessageType type, byte[] payload) {
        enqueue(frames(Frame.KIND_MESSAGE, type.ordered, type.type, type.subtype, 0, payload));
    }

    void sendResponse(int type, int subtype, int id, byte[] payload) {
        enqueue(frames(Frame.KIND_RESPONSE, false, type, subtype, id, payload));
    }

    private void enqueue(byte[] bytes) {
        if (closed.get()) {
            return;
        }
        queue.add(bytes);
        // Whoever holds the lock writes what is queued; after unlocking it looks again, so
        // a frame queued while the lock was taken is never left behind.
        while (!queue.isEmpty() && writeLock.tryLock()) {
            try {
                byte[] next;
                while ((next = queue.poll()) != null) {
                    out.write(next);
                }
                out.flush();
            } catch (IOException e) {
                queue.clear();
                close("write failed: " + e.getMessage());
                return;
            } finally {
                writeLock.unlock();
            }
        }
    }

    private void readLoop() {
        try {
            DataInputStream in = new DataInputStream(new BufferedInputStream(socket.getInputStream(), 256 * 1024));
            byte[] header = new byte[Frame.HEADER_BYTES];
            Frame first = null;
            java.io.ByteArrayOutputStream assembly = null;
            while (!closed.get()) {
                in.readFully(header);
                Frame frame = Frame.decode(header, 0);
                byte[] payload = new byte[frame.payloadBytes];
                in.readFully(payload);
                if (frame.fragment == Frame.WHOLE) {
                    if (first != null) {
                        throw new MyriadException.Protocol("whole frame inside a fragmented message");
                    }
                    dispatch(frame, payload);
                    continue;
                }
                if (first == null) {
                    if (frame.fragment == Frame.LAST) {
                        throw new MyriadException.Protocol("orphan fragment");
                    }
                    first = frame;
                    assembly = new java.io.ByteArrayOutputStream(payload.length * 2);
                } else if (first.messageId != frame.messageId || first.kind != frame.kind
                        || first.type != frame.type || first.subtype != frame.subtype
                        || first.ordered != frame.ordered) {
                    throw new MyriadException.Protocol("fragment mismatch");
                }
                if ((long) assembly.size() + payload.length > messageBytesMax) {
                    throw new MyriadException.Protocol("message above " + messageBytesMax + " bytes");
                }
                assembly.write(payload);
                if (frame.fragment == Frame.LAST) {
                    dispatch(first, assembly.toByteArray());
                    first = null;
                    assembly = null;
                }
            }
        } catch (IOException e) {
            close("connection lost: " + e.getMessage());
        } catch (MyriadException e) {
            LOG.log(Level.WARNING, "closing the connection to node " + remoteNode + ": " + e.getMessage());
            close("protocol error: " + e.getMessage());
        } catch (RuntimeException e) {
            LOG.log(Level.WARNING, "closing the connection to node " + remoteNode, e);
            close("handler failed: " + e);
        }
    }

    private void dispatch(Frame frame, byte[] payload) {
        if (frame.kind == Frame.KIND_RESPONSE) {
            CompletableFuture<byte[]> future = pending.remove(frame.messageId);
            if (future != null) {
                future.complete(payload);
            }
            return;
        }
        Handler handler = endpoint.handler(frame.type, frame.subtype);
        if (handler == null) {
            LOG.log(Level.FINE, "no handler for type " + frame.type + "." + frame.subtype + " from " + remoteNode);
            return;
        }
        handler.handle(new Incoming(this, frame.type, frame.subtype, frame.messageId,
                frame.kind == Frame.KIND_REQUEST, payload));
    }

    /** Closes the connection; pending requests fail with {@link ConnectionLostException}. */
    public void close(String reason) {
        if (!closed.compareAndSet(false, true)) {
            return;
        }
        queue.clear();
        try {
            socket.close();
        } catch (IOException ignored) {
            // closing anyway
        }
        for (Integer id : pending.keySet()) {
            CompletableFuture<byte[]> future = pending.remove(id);
            if (future != null) {
                future.completeExceptionally(new ConnectionLostException(remoteNode, reason));
            }
        }
        endpoint.closed(this);
    }
}
