package io.myriad.client.net;

import io.myriad.client.MyriadException;
import io.myriad.client.wire.Frame;
import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.Socket;
import java.net.SocketTimeoutException;

/**
 * A direct request lane ({@code docs/wire-format.md}, "Lanes"): an extra authenticated TCP
 * connection to one node on which one calling thread at a time writes a request and reads
 * its response itself, with blocking socket calls: no hand-off to the connection's reader
 * thread and back. Owned by {@link Endpoint}'s lane pool; a lane is lent to one thread per
 * call.
 *
 * <p>Invariants: at most one request in flight; a lane is given back to the pool only after
 * a call that read exactly its response (anything else closes it: a timeout, an I/O error,
 * a frame that is not the awaited response, bytes after it), so a late response is never
 * read as the answer to a later request.
 */
final class Lane {
    /** Nanoseconds a lane may lie idle before it is checked for unread bytes when reused. */
    static final long CHECK_IDLE_NS = 1_000_000;

    final int node;
    private final Socket socket;
    private final OutputStream out;
    private final DataInputStream in;
    private final int messageBytesMax;
    private final byte[] header = new byte[Frame.HEADER_BYTES];
    private int nextId = 1;
    private boolean open = true;
    /** When the last call ended ({@link System#nanoTime}). */
    long idleSince = System.nanoTime();

    Lane(int node, Socket socket, int messageBytesMax) throws IOException {
        this.node = node;
        this.socket = socket;
        this.out = socket.getOutputStream();
        this.in = new DataInputStream(new BufferedInputStream(socket.getInputStream(), 16 * 1024));
        this.messageBytesMax = messageBytesMax;
    }

    boolean isOpen() {
        return open && !socket.isClosed();
    }

    /**
     * Whether a lane idle for a while may be reused: nothing unread waits on it (a closed
     * lane of a restarted node shows as an error on the next call, which the caller then
     * sends another way).
     */
    boolean reusable() {
        if (!isOpen()) {
            return false;
        }
        if (System.nanoTime() - idleSince < CHECK_IDLE_NS) {
            return true;
        }
        try {
            return in.available() == 0;
        } catch (IOException e) {
            return false;
        }
    }

    /**
     * Sends a request of {@code type} and waits at most {@code timeoutMs} for each read of
     * its response; returns the response payload. Closes the lane on any failure:
     * {@link SocketTimeoutException} on a timeout, another {@link IOException} if the lane
     * broke, {@link MyriadException.Protocol} if the node answered with anything but the
     * response.
     */
    byte[] call(MessageType type, byte[] payload, long timeoutMs) throws IOException {
        boolean done = false;
        try {
            int id = nextId++;
            if (nextId == 0) {
                nextId = 1;
            }
            socket.setSoTimeout((int) Math.max(1, Math.min(Integer.MAX_VALUE, timeoutMs)));
            out.write(Connection.frames(Frame.KIND_REQUEST, false, type.type, type.subtype, id, payload));
            out.flush();
            byte[] response = readResponse(type, id);
            if (in.available() > 0) {
                throw new MyriadException.Protocol("bytes after the response on a lane");
            }
            done = true;
            idleSince = System.nanoTime();
            return response;
        } finally {
            if (!done) {
                close();
            }
        }
    }

    private byte[] readResponse(MessageType type, int id) throws IOException {
        ByteArrayOutputStream assembly = null;
        while (true) {
            in.readFully(header);
            Frame frame = Frame.decode(header, 0);
            if (frame.kind != Frame.KIND_RESPONSE || frame.messageId != id || frame.type != type.type
                    || frame.subtype != type.subtype) {
                throw new MyriadException.Protocol("a lane answered with a frame that is not the awaited response");
            }
            byte[] payload = new byte[frame.payloadBytes];
            in.readFully(payload);
            if (frame.fragment == Frame.WHOLE && assembly == null) {
                return payload;
            }
            if (frame.fragment == Frame.WHOLE || (frame.fragment == Frame.LAST && assembly == null)) {
                throw new MyriadException.Protocol("fragment out of place on a lane");
            }
            if (assembly == null) {
                assembly = new ByteArrayOutputStream(payload.length * 2);
            }
            if ((long) assembly.size() + payload.length > messageBytesMax) {
                throw new MyriadException.Protocol("response above " + messageBytesMax + " bytes");
            }
            assembly.write(payload);
            if (frame.fragment == Frame.LAST) {
                return assembly.toByteArray();
            }
        }
    }

    void close() {
        open = false;
        try {
            socket.close();
        } catch (IOException ignored) {
            // closing anyway
        }
    }
}
