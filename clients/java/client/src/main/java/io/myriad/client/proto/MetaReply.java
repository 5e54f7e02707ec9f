package io.myriad.client.proto;

import io.myriad.client.BarrierStatus;
import io.myriad.client.NodeInfo;
import java.util.List;
import java.util.Map;

/**
 * A decoded superpeer reply ({@code myriad_proto::meta::MetaReply}); {@link #tag} says which
 * fields are set.
 */
public final class MetaReply {
    /** Tag 1: {@link #response}. */
    public static final int RESPONSE = 1;
    /** Tag 2: {@link #lookup} = creator, first, last, owner. */
    public static final int LOOKUP = 2;
    /** Tag 3: {@link #ranges} = (first, last, owner) triples. */
    public static final int LOOKUP_TREE = 3;
    /** Tag 4: {@link #cid} or {@link #present} false. */
    public static final int NAME = 4;
    /** Tag 5: {@link #names}. */
    public static final int NAMES = 5;
    /** Tag 6: {@link #blob} (null: absent). */
    public static final int TMP = 6;
    /** Tag 7: {@link #sizes} by name. */
    public static final int TMP_LIST = 7;
    /** Tag 8: {@link #barrier} (null: no such barrier). */
    public static final int BARRIER = 8;
    /** Tag 9: {@link #nodes}. */
    public static final int NODES = 9;
    /** Tag 10: {@link #zones}. */
    public static final int ZONES = 10;
    /** Tag 11: a superpeer's status ({@link #status}). */
    public static final int STATUS = 11;
    /** Tag 12: not the leader; {@link #leader} (-1: unknown). */
    public static final int NOT_LEADER = 12;
    /** Tag 13: unavailable, {@link #reason}. */
    public static final int UNAVAILABLE = 13;
    /** Tag 14: peer bases ({@link #bases}: zone base, zones end, lid base, lids reserved). */
    public static final int BASES = 14;

    /** Which reply. */
    public final int tag;
    /** A write's response. */
    public MetaResponse response;
    /** creator, first, last, owner. */
    public long[] lookup;
    /** (first, last, owner) triples. */
    public long[] ranges;
    /** Whether an optional value is present (name, tmp blob, barrier). */
    public boolean present;
    /** The CID of a name. */
    public long cid;
    /** Names and CIDs, in name order. */
    public Map<String, Long> names;
    /** A tmp blob. */
    public byte[] blob;
    /** Tmp blob sizes by name. */
    public Map<String, Long> sizes;
    /** A barrier's status. */
    public BarrierStatus barrier;
    /** The node table. */
    public List<NodeInfo> nodes;
    /** Zones: zone number to backups. */
    public Map<Long, List<Integer>> zones;
    /** node, epoch, leader (-1), term, last log index (-1), last applied (-1). */
    public long[] status;
    /** The configured superpeers (ID to address) of a status reply. */
    public Map<Integer, String> members;
    /** The leader hint of NOT_LEADER (-1: unknown). */
    public int leader = -1;
    /** The reason of UNAVAILABLE. */
    public String reason;
    /** zone base, zones end, lid base, lids reserved. */
    public long[] bases;

    MetaReply(int tag) {
        this.tag = tag;
    }
}
