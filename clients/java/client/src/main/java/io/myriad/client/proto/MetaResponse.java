package io.myriad.client.proto;

import io.myriad.client.MetaError;
import java.util.Map;

/**
 * The response of a committed metadata command ({@code myriad_meta::Response}); {@link #tag}
 * says which fields are set.
 */
public final class MetaResponse {
    /** Tag 1: done. */
    public static final int DONE = 1;
    /** Tag 2: joined (node, incarnation, epoch in {@link #values}). */
    public static final int JOINED = 2;
    /** Tag 3: an epoch ({@link #values}[0]). */
    public static final int EPOCH = 3;
    /** Tag 4: a barrier was allocated ({@link #values}[0] = its ID). */
    public static final int BARRIER_ALLOCATED = 4;
    /** Tag 5: a barrier sign-on (round, signed, size in {@link #values}; {@link #released}). */
    public static final int BARRIER = 5;
    /** Tag 6: refused ({@link #error}). */
    public static final int ERROR = 6;

    /** Which response. */
    public final int tag;
    /** Numeric fields, see the tags. */
    public long[] values = new long[0];
    /** A sign-on that completed the round: every participant's value (null: not released). */
    public Map<Integer, Long> released;
    /** The refusal. */
    public MetaError error;

    MetaResponse(int tag) {
        this.tag = tag;
    }
}
