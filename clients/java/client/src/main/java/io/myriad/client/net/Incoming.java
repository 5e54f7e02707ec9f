package io.myriad.client.net;

/**
 * A request or one-way message received from another node, handed to the handler
 * registered for its type. {@link #respond} answers a request on the connection it came
 * on (at most once).
 */
public final class Incoming {
    /** The sending node. */
    public final int from;
    /** Type byte. */
    public final int type;
    /** Subtype byte. */
    public final int subtype;
    /** The payload. */
    public final byte[] payload;
    private final Connection connection;
    private final int requestId;
    private final boolean request;

    Incoming(Connection connection, int type, int subtype, int requestId, boolean request, byte[] payload) {
        this.connection = connection;
        this.from = connection.remoteNode;
        this.type = type;
        this.subtype = subtype;
        this.requestId = requestId;
        this.request = request;
        this.payload = payload;
    }

    /** Whether the sender waits for a response. */
    public boolean isRequest() {
        return request;
    }

    /** Answers the request (ignored for one-way messages). */
    public void respond(byte[] response) {
        if (request) {
            connection.sendResponse(type, subtype, requestId, response);
        }
    }
}
