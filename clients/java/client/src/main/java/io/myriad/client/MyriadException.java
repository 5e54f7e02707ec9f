package io.myriad.client;

/**
 * Base of every error a Myriad client call raises. Unchecked, so that it travels through
 * {@link java.util.concurrent.CompletableFuture}s unchanged (async calls complete
 * exceptionally with one of the subclasses; blocking calls throw it). The subclasses mirror
 * the Rust client's {@code ClientError} variants one to one.
 */
public class MyriadException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** An error with a message. */
    public MyriadException(String message) {
        super(message);
    }

    /** An error with a message and a cause. */
    public MyriadException(String message, Throwable cause) {
        super(message, cause);
    }

    /** The chunk does not exist (never created, or removed). */
    public static final class NotFound extends MyriadException {
        private static final long serialVersionUID = 1L;
        /** The chunk. */
        public final long cid;

        /** Chunk {@code cid} was not found. */
        public NotFound(long cid) {
            super("chunk " + ChunkIds.format(cid) + " not found");
            this.cid = cid;
        }
    }

    /** The node that owns the chunk (or the node addressed) is unreachable or failed. */
    public static final class NodeUnavailable extends MyriadException {
        private static final long serialVersionUID = 1L;
        /** The node. */
        public final int node;

        /** Node {@code node} is unavailable. */
        public NodeUnavailable(int node) {
            super("node " + ChunkIds.formatNode(node) + " is unavailable");
            this.node = node;
        }
    }

    /** No answer within the call's timeout. */
    public static final class Timeout extends MyriadException {
        private static final long serialVersionUID = 1L;
        /** The timeout that passed, in milliseconds. */
        public final long timeoutMs;

        /** {@code what} was not answered within {@code timeoutMs}. */
        public Timeout(String what, long timeoutMs) {
            super("timed out after " + timeoutMs + " ms: " + what);
            this.timeoutMs = timeoutMs;
        }
    }

    /** No superpeer answered, or the group has no leader (no quorum). */
    public static final class SuperpeersUnavailable extends MyriadException {
        private static final long serialVersionUID = 1L;

        /** With the last reason seen. */
        public SuperpeersUnavailable(String reason) {
            super("the superpeer group is unavailable: " + reason);
        }
    }

    /** The superpeer group refused the request (a metadata error, see {@link MetaError}). */
    public static final class Meta extends MyriadException {
        private static final long serialVersionUID = 1L;
        /** The group's error. */
        public final MetaError error;

        /** The group refused with {@code error}. */
        public Meta(MetaError error) {
            super("the superpeer group refused: " + error);
            this.error = error;
        }
    }

    /** The owner could not store the chunk: no memory left, or larger than allowed. */
    public static final class OutOfSpace extends MyriadException {
        private static final long serialVersionUID = 1L;
        /** The node. */
        public final int node;

        /** Node {@code node} cannot store it, for {@code reason}. */
        public OutOfSpace(int node, String reason) {
            super("node " + ChunkIds.formatNode(node) + " cannot store it: " + reason);
            this.node = node;
        }
    }

    /** A chunk lock was not granted within its timeout. */
    public static final class LockTimeout extends MyriadException {
        private static final long serialVersionUID = 1L;
        /** The chunk. */
        public final long cid;

        /** The lock on {@code cid} was not granted in time. */
        public LockTimeout(long cid) {
            super("lock on chunk " + ChunkIds.format(cid) + " not granted in time");
            this.cid = cid;
        }
    }

    /** The caller passed an invalid argument (reported before anything was sent). */
    public static final class InvalidArgument extends MyriadException {
        private static final long serialVersionUID = 1L;

        /** Why the argument is invalid. */
        public InvalidArgument(String reason) {
            super("invalid argument: " + reason);
        }
    }

    /**
     * A server sent something this client does not understand. The only exception that
     * decoding a server's bytes can raise.
     */
    public static final class Protocol extends MyriadException {
        private static final long serialVersionUID = 1L;

        /** What was wrong with the bytes. */
        public Protocol(String reason) {
            super("protocol error: " + reason);
        }
    }

    /** The server failed the request for a reason of its own. */
    public static final class Server extends MyriadException {
        private static final long serialVersionUID = 1L;
        /** The node. */
        public final int node;

        /** Node {@code node} failed the request for {@code reason}. */
        public Server(int node, String reason) {
            super("node " + ChunkIds.formatNode(node) + " failed the request: " + reason);
            this.node = node;
        }
    }

    /** Joining the cluster failed. */
    public static final class Join extends MyriadException {
        private static final long serialVersionUID = 1L;

        /** Why. */
        public Join(String reason) {
            super("could not join the cluster: " + reason);
        }

        /** Why, with the cause. */
        public Join(String reason, Throwable cause) {
            super("could not join the cluster: " + reason, cause);
        }
    }

    /** The client was shut down. */
    public static final class Shutdown extends MyriadException {
        private static final long serialVersionUID = 1L;

        /** The client is shut down. */
        public Shutdown() {
            super("the client is shut down");
        }
    }
}
