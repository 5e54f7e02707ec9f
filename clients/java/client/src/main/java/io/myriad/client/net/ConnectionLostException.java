package io.myriad.client.net;

/**
 * A request's connection closed (or could not be opened) before its response arrived: the
 * node is unreachable. Internal to the client (routing turns it into a lookup refresh or
 * {@code NodeUnavailable}).
 */
public final class ConnectionLostException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    /** The node. */
    public final int node;

    /** Node {@code node} is unreachable, for {@code reason}. */
    public ConnectionLostException(int node, String reason) {
        super("node " + node + ": " + reason, null, false, false);
        this.node = node;
    }
}
