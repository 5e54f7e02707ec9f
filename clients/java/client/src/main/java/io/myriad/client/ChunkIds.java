package io.myriad.client;

/**
 * Chunk IDs (CIDs) as plain {@code long}s: the creator's 16-bit node ID above a 48-bit
 * local ID, exactly as {@code myriad_types::ChunkId}. Node IDs are {@code int}s in
 * 0..=0xffff.
 */
public final class ChunkIds {
    /** Bits of a CID that hold the local ID. */
    public static final int LOCAL_ID_BITS = 48;
    /** The largest local ID (2^48 - 1). */
    public static final long LOCAL_ID_MAX = (1L << LOCAL_ID_BITS) - 1;

    private ChunkIds() {}

    /** The CID of {@code creator}'s local ID {@code localId}. */
    public static long of(int creator, long localId) {
        if (creator < 0 || creator > 0xffff) {
            throw new MyriadException.InvalidArgument("node ID " + creator + " is not 16 bits");
        }
        if (localId < 0 || localId > LOCAL_ID_MAX) {
            throw new MyriadException.InvalidArgument("local ID " + localId + " is not 48 bits");
        }
        return ((long) creator << LOCAL_ID_BITS) | localId;
    }

    /** The node that created the chunk. */
    public static int creator(long cid) {
        return (int) (cid >>> LOCAL_ID_BITS);
    }

    /** The local ID within the creator's ID space. */
    public static long localId(long cid) {
        return cid & LOCAL_ID_MAX;
    }

    /** {@code 0x} and 16 hex digits, as the Rust side prints CIDs. */
    public static String format(long cid) {
        return String.format("0x%016x", cid);
    }

    /** {@code 0x} and 4 hex digits, as the Rust side prints node IDs. */
    public static String formatNode(int node) {
        return String.format("0x%04x", node);
    }
}
