package io.myriad.client.proto;

/**
 * A decoded chunk reply ({@code myriad_proto::chunk::ChunkReply}): its tag says which
 * fields are set. Per-item arrays are in request order; a null entry of {@link #errors}
 * means the item succeeded.
 */
public final class ChunkReply {
    /** Tag 1: {@link #cids} of new chunks. */
    public static final int CREATED = 1;
    /** Tag 2: {@link #data} or {@link #errors} per item. */
    public static final int DATA = 2;
    /** Tag 3: {@link #errors} per item (null: ok). */
    public static final int STATUSES = 3;
    /** Tag 4: {@link #sizes} or {@link #errors} per item. */
    public static final int SIZES = 4;
    /** Tag 5: {@link #ranges} (first, last pairs) and {@link #truncated}. */
    public static final int RANGES = 5;
    /** Tag 6: {@link #stats}. */
    public static final int STATS = 6;
    /** Tag 7: the whole operation failed with {@link #failed}. */
    public static final int FAILED = 7;
    /** Tag 8: the peer could not decode the request ({@link #malformed}). */
    public static final int MALFORMED = 8;

    /** Which reply. */
    public final int tag;
    /** Created CIDs. */
    public long[] cids;
    /** Data items (null where the item failed). */
    public byte[][] data;
    /** Item errors (null where the item succeeded). */
    public ItemError[] errors;
    /** Sizes. */
    public long[] sizes;
    /** Ranges as first0, last0, first1, last1, ... */
    public long[] ranges;
    /** More ranges existed. */
    public boolean truncated;
    /**
     * chunks, payload bytes, used bytes, free bytes, region bytes, rereplication pending,
     * requests served.
     */
    public long[] stats;
    /** The failure of the whole operation. */
    public ItemError failed;
    /** Why the peer could not decode the request. */
    public String malformed;

    ChunkReply(int tag) {
        this.tag = tag;
    }

    /** Items in a per-item reply (0 for the others). */
    public int itemCount() {
        return errors == null ? 0 : errors.length;
    }
}
