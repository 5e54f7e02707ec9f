package io.myriad.client.net;

/** Handles incoming requests and messages of one type (called on the connection's reader thread: must not block). */
@FunctionalInterface
public interface Handler {
    /** Handles one request or message. */
    void handle(Incoming incoming);
}
