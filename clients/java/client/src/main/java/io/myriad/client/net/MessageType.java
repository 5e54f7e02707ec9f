package io.myriad.client.net;

/**
 * A message type: type and subtype bytes and whether the type is ordered
 * ({@code myriad_proto::types}).
 */
public final class MessageType {
    /** Any node to a superpeer: a metadata request. */
    public static final MessageType META_REQUEST = new MessageType(11, 0, false);
    /** A joining node to a superpeer. */
    public static final MessageType JOIN = new MessageType(11, 1, false);
    /** Superpeer to a watched node. */
    public static final MessageType HEARTBEAT = new MessageType(11, 2, false);
    /** A node to a superpeer: lost its connection to another node. */
    public static final MessageType FAILURE_REPORT = new MessageType(11, 3, false);
    /** Superpeer to every node: committed membership and ownership changes (ordered). */
    public static final MessageType EVENT = new MessageType(11, 4, true);
    /** Superpeer to a barrier's participants. */
    public static final MessageType BARRIER_RELEASED = new MessageType(11, 5, false);
    /** Client to peer: a chunk request. */
    public static final MessageType CHUNK = new MessageType(20, 0, false);
    /** Client to the peer owning a CID range: move the range to another peer. */
    public static final MessageType MIGRATE = new MessageType(20, 1, false);

    /** Type byte. */
    public final int type;
    /** Subtype byte. */
    public final int subtype;
    /** Ordered type. */
    public final boolean ordered;

    /** A type. */
    public MessageType(int type, int subtype, boolean ordered) {
        this.type = type;
        this.subtype = subtype;
        this.ordered = ordered;
    }

    int key() {
        return type << 8 | subtype;
    }
}
