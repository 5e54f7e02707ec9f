package io.myriad.ycsb;

import io.myriad.client.ChunkIds;
import java.util.List;

/**
 * The deterministic YCSB key to CID mapping (no lookup per key).
 *
 * <p>YCSB keys are a prefix ({@code user}) and the record number {@code k} (the workloads
 * set {@code insertorder=ordered}, so {@code k} is the plain record number, not a hash).
 * With the peers {@code p[0..P)} fixed when the table is first used (sorted node IDs,
 * recorded in temporary storage so that the run phase uses the load phase's list):
 *
 * <pre>
 * CID(k) = creator p[k mod P], local ID LID_BASE + k div P
 * </pre>
 *
 * The record is created by the insert operation under that CID on its peer (a chunk under
 * a caller-chosen ID of the peer's own creator space), so reads, updates and deletes go
 * straight to the owner. {@link #LID_BASE} = 2^40 puts these IDs far above the local IDs
 * a peer hands out itself (sequentially from 0), so they never collide with chunks created
 * the ordinary way. Keys whose number is not below {@link #KEYS_PER_PEER_MAX} × P are
 * refused (a hashed key order does not fit the scheme). The table name is not part of the
 * CID: two tables whose peer lists overlap share record numbers' IDs, so one cluster holds
 * one YCSB table (YCSB's workloads use one, {@code usertable}).
 */
public final class KeyScheme {
    /** First local ID of YCSB records. */
    public static final long LID_BASE = 1L << 40;
    /** Record numbers per peer that fit below the 48-bit local ID limit. */
    public static final long KEYS_PER_PEER_MAX = ChunkIds.LOCAL_ID_MAX - LID_BASE + 1;

    private final int[] peers;

    /** The scheme over these peers (in this order). */
    public KeyScheme(List<Integer> peers) {
        if (peers.isEmpty()) {
            throw new IllegalArgumentException("no peers");
        }
        this.peers = peers.stream().mapToInt(Integer::intValue).toArray();
    }

    /** The record number in a YCSB key: the digits after its non-digit prefix. */
    public static long keyNumber(String key) {
        int at = 0;
        while (at < key.length() && !Character.isDigit(key.charAt(at))) {
            at++;
        }
        if (at == key.length() || key.length() - at > 18) {
            throw new IllegalArgumentException("key " + key + " has no record number (use insertorder=ordered)");
        }
        return Long.parseLong(key.substring(at));
    }

    /** The CID of a YCSB key. */
    public long cid(String key) {
        long k = keyNumber(key);
        long local = k / peers.length;
        if (local >= KEYS_PER_PEER_MAX) {
            throw new IllegalArgumentException("record number " + k + " is beyond the key scheme (use insertorder=ordered)");
        }
        return ChunkIds.of(peers[(int) (k % peers.length)], LID_BASE + local);
    }
}
