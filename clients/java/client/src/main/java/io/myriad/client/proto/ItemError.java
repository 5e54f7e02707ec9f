package io.myriad.client.proto;

/**
 * Why one item of a chunk request failed ({@code myriad_proto::chunk::ItemError}): a status
 * tag and, for {@link #INVALID} and {@link #INTERNAL}, a text.
 */
public final class ItemError {
    /** The peer owns the CID but holds no such chunk. */
    public static final int NOT_FOUND = 1;
    /** The peer does not own the CID: refresh the lookup and ask the owner. */
    public static final int NOT_OWNER = 2;
    /** Larger than the peer allows for one chunk. */
    public static final int TOO_LARGE = 3;
    /** The peer has no memory left. */
    public static final int OUT_OF_MEMORY = 4;
    /** The chunk's lock was not granted in time. */
    public static final int LOCK_TIMEOUT = 5;
    /** The item is invalid (text says why). */
    public static final int INVALID = 6;
    /** The peer failed for a reason of its own (text says why). */
    public static final int INTERNAL = 7;

    /** The status tag (1..=7). */
    public final int code;
    /** The text of {@link #INVALID} / {@link #INTERNAL}, else null. */
    public final String text;

    /** An error with this tag and text. */
    public ItemError(int code, String text) {
        this.code = code;
        this.text = text;
    }

    @Override
    public String toString() {
        switch (code) {
            case NOT_FOUND: return "not found";
            case NOT_OWNER: return "not the owner";
            case TOO_LARGE: return "too large";
            case OUT_OF_MEMORY: return "out of memory";
            case LOCK_TIMEOUT: return "lock timeout";
            case INVALID: return "invalid: " + text;
            default: return "internal error: " + text;
        }
    }

    @Override
    public boolean equals(Object other) {
        return other instanceof ItemError && ((ItemError) other).code == code
                && java.util.Objects.equals(((ItemError) other).text, text);
    }

    @Override
    public int hashCode() {
        return code * 31 + (text == null ? 0 : text.hashCode());
    }
}
