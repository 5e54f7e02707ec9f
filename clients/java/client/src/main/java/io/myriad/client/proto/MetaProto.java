package io.myriad.client.proto;

import io.myriad.client.BarrierStatus;
import io.myriad.client.MetaError;
import io.myriad.client.MyriadException;
import io.myriad.client.NodeInfo;
import io.myriad.client.wire.Decoder;
import io.myriad.client.wire.Encoder;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The metadata family ({@code crates/proto/src/meta.rs} and the embedded command and
 * response encodings of {@code crates/meta/src/command.rs}): metadata requests (11.0),
 * joins (11.1), heartbeats (11.2), events (11.4), barrier releases (11.5). Encoders are
 * static methods; every decoder throws nothing but {@link MyriadException.Protocol}.
 * Byte layouts: {@code docs/protocol.md}.
 */
public final class MetaProto {
    /** Longest address. */
    public static final int ADDRESS_BYTES_MAX = 256;
    /** Longest name (nameservice, tmp storage). */
    public static final int NAME_BYTES_MAX = 256;
    /** Most names. */
    public static final int NAMES_MAX = 1 << 20;
    /** Largest tmp blob. */
    public static final int TMP_BLOB_BYTES_MAX = 1 << 20;
    /** Largest barrier. */
    public static final int BARRIER_SIZE_MAX = 65_535;
    /** Longest embedded command or response. */
    public static final int EMBEDDED_BYTES_MAX = TMP_BLOB_BYTES_MAX + 4096;
    /** Longest reason text. */
    public static final int REASON_BYTES_MAX = 4096;
    /** Most nodes in a list. */
    public static final int NODES_MAX = 65_536;
    /** Most lookup ranges. */
    public static final int LOOKUP_RANGES_MAX = 1 << 20;
    /** Most superpeers in a status. */
    public static final int SUPERPEERS_MAX = 64;
    /** Most zones per node. */
    public static final int ZONES_PER_NODE_MAX = 1 << 20;
    /** Most backups per zone. */
    public static final int BACKUPS_PER_ZONE_MAX = 16;
    private static final int RECORD_BYTES_MIN = 14;
    private static final int META_TEXT_MAX = 4096;

    private MetaProto() {}

    // ----- metadata requests -------------------------------------------------------------

    /** Commit an encoded command (see the {@code command*} methods). */
    public static byte[] write(byte[] command) {
        return new Encoder(command.length + 8).u8(1).bytes(command).toByteArray();
    }

    /** The lookup range holding {@code cid}. */
    public static byte[] lookup(long cid) {
        return new Encoder(9).u8(2).u64(cid).toByteArray();
    }

    /** The exception ranges of {@code creator}. */
    public static byte[] lookupTree(int creator) {
        return new Encoder(3).u8(3).u16(creator).toByteArray();
    }

    /** The CID bound to {@code name}. */
    public static byte[] nameGet(String name) {
        return new Encoder().u8(4).str(name).toByteArray();
    }

    /** Every name binding. */
    public static byte[] nameList() {
        return new byte[] {5};
    }

    /** A tmp blob. */
    public static byte[] tmpGet(String name) {
        return new Encoder().u8(6).str(name).toByteArray();
    }

    /** Names and sizes of the tmp blobs. */
    public static byte[] tmpList() {
        return new byte[] {7};
    }

    /** A barrier's status. */
    public static byte[] barrierStatus(long id) {
        return new Encoder().u8(8).varint(id).toByteArray();
    }

    /** The node table. */
    public static byte[] nodes() {
        return new byte[] {9};
    }

    /** The backup zones of {@code owner}. */
    public static byte[] zones(int owner) {
        return new Encoder(3).u8(10).u16(owner).toByteArray();
    }

    /** The answering superpeer's status. */
    public static byte[] status() {
        return new byte[] {11};
    }

    // ----- commands ------------------------------------------------------------------------

    /** Command: {@code node} leaves. */
    public static byte[] commandLeave(int node) {
        return new Encoder().u8(2).varint(node).toByteArray();
    }

    /** Command: bind {@code name} to {@code cid}. */
    public static byte[] commandNameRegister(String name, long cid) {
        return new Encoder().u8(6).str(name).u64(cid).toByteArray();
    }

    /** Command: remove a name. */
    public static byte[] commandNameRemove(String name) {
        return new Encoder().u8(7).str(name).toByteArray();
    }

    /** Command: allocate a barrier. */
    public static byte[] commandBarrierAlloc(long size) {
        return new Encoder().u8(8).varint(size).toByteArray();
    }

    /** Command: sign on to a barrier. */
    public static byte[] commandBarrierSignOn(long id, int node, long value) {
        return new Encoder().u8(9).varint(id).varint(node).u64(value).toByteArray();
    }

    /** Command: resize a barrier. */
    public static byte[] commandBarrierResize(long id, long size) {
        return new Encoder().u8(10).varint(id).varint(size).toByteArray();
    }

    /** Command: free a barrier. */
    public static byte[] commandBarrierFree(long id) {
        return new Encoder().u8(11).varint(id).toByteArray();
    }

    /** Command: store a tmp blob. */
    public static byte[] commandTmpPut(String name, byte[] data, boolean createOnly) {
        return new Encoder(data.length + 32).u8(12).str(name).bytes(data).bool(createOnly).toByteArray();
    }

    /** Command: remove a tmp blob. */
    public static byte[] commandTmpRemove(String name) {
        return new Encoder().u8(13).str(name).toByteArray();
    }

    // ----- join, heartbeat -----------------------------------------------------------------

    /** A join request ({@code reclaim} -1: none). */
    public static byte[] joinRequest(int role, String address, int capabilities, int rack, int switchId,
            int reclaim) {
        Encoder out = new Encoder().u8(role).str(address).u8(capabilities).u16(rack).u16(switchId);
        if (reclaim >= 0) {
            out.u8(1).u16(reclaim);
        } else {
            out.u8(0);
        }
        return out.toByteArray();
    }

    /** A heartbeat reply. */
    public static byte[] heartbeatReply(long epoch, long nonce) {
        return new Encoder(20).varint(epoch).varint(nonce).toByteArray();
    }

    /** A decoded join reply. */
    public static final class JoinReply {
        /** 1 ok, 2 not leader, 3 refused, 4 unavailable. */
        public final int tag;
        /** Ok: the assigned ID. */
        public int id;
        /** Ok: the incarnation. */
        public long incarnation;
        /** Ok: the epoch. */
        public long epoch;
        /** Ok: the node table. */
        public List<NodeInfo> nodes;
        /** Ok: the lease in ms. */
        public long leaseMs;
        /** Not leader: the hint (-1 unknown). */
        public int leader = -1;
        /** Refused: why. */
        public MetaError refused;
        /** Unavailable: why. */
        public String reason;

        JoinReply(int tag) {
            this.tag = tag;
        }
    }

    /** Decodes a join reply. */
    public static JoinReply decodeJoinReply(byte[] payload) {
        Decoder in = new Decoder(payload);
        int tag = in.u8("join reply tag");
        JoinReply reply = new JoinReply(tag);
        switch (tag) {
            case 1:
                reply.id = in.u16("node");
                reply.incarnation = in.varintU32("incarnation");
                reply.epoch = in.varint("epoch");
                reply.nodes = records(in);
                reply.leaseMs = in.varintU32("lease");
                break;
            case 2:
                reply.leader = optionNode(in);
                break;
            case 3: {
                MetaResponse response = embeddedResponse(in, "metadata error");
                if (response.tag != MetaResponse.ERROR) {
                    throw new MyriadException.Protocol("join refusal is not an error");
                }
                reply.refused = response.error;
                break;
            }
            case 4:
                reply.reason = in.str("reason", REASON_BYTES_MAX);
                break;
            default:
                throw new MyriadException.Protocol("unknown join reply tag " + tag);
        }
        in.finish();
        return reply;
    }

    /** A decoded heartbeat: epoch, acked, lease ms. */
    public static long[] decodeHeartbeat(byte[] payload) {
        Decoder in = new Decoder(payload);
        long[] out = {in.varint("epoch"), in.varint("acked"), in.varintU32("lease")};
        in.finish();
        return out;
    }

    /** A decoded event push. */
    public static final class Event {
        /** The epoch after the event. */
        public final long epoch;
        /** 1 joined, 2 failed, 3 left, 4 owner changed. */
        public final int tag;
        /** Joined: the record. */
        public NodeInfo record;
        /** Failed/left: the node; owner changed: the creator. */
        public int node;
        /** Owner changed: first LID, last LID. */
        public long first;
        /** Owner changed: last LID. */
        public long last;
        /** Owner changed: the new owner. */
        public int owner;

        Event(long epoch, int tag) {
            this.epoch = epoch;
            this.tag = tag;
        }
    }

    /** Decodes an event push. */
    public static Event decodeEvent(byte[] payload) {
        Decoder in = new Decoder(payload);
        long epoch = in.varint("epoch");
        int tag = in.u8("event tag");
        Event event = new Event(epoch, tag);
        switch (tag) {
            case 1:
                event.record = record(in);
                break;
            case 2:
            case 3:
                event.node = in.u16("node");
                break;
            case 4:
                event.node = in.u16("node");
                event.first = in.varint("first");
                event.last = in.varint("last");
                event.owner = in.u16("node");
                break;
            default:
                throw new MyriadException.Protocol("unknown event tag " + tag);
        }
        in.finish();
        return event;
    }

    /** A decoded barrier release: id, round, values. */
    public static final class BarrierReleased {
        /** The barrier. */
        public long id;
        /** The completed round. */
        public long round;
        /** Every participant's value. */
        public Map<Integer, Long> values;
    }

    /** Decodes a barrier release. */
    public static BarrierReleased decodeBarrierReleased(byte[] payload) {
        Decoder in = new Decoder(payload);
        BarrierReleased out = new BarrierReleased();
        out.id = in.varintU32("barrier");
        out.round = in.varint("round");
        out.values = values(in);
        in.finish();
        return out;
    }

    // ----- replies --------------------------------------------------------------------------

    private static int optionNode(Decoder in) {
        return in.bool("option") ? in.u16("node") : -1;
    }

    private static long optionU64(Decoder in) {
        return in.bool("option") ? in.varint("optional value") : -1;
    }

    private static Map<Integer, Long> values(Decoder in) {
        int count = in.count("barrier values", 10, BARRIER_SIZE_MAX);
        Map<Integer, Long> values = new LinkedHashMap<>();
        for (int i = 0; i < count; i++) {
            int node = in.u16("node");
            values.put(node, in.u64("barrier value"));
        }
        return values;
    }

    /** One node record in the wire layout. */
    public static NodeInfo record(Decoder in) {
        int id = in.u16("node");
        int role = in.u8("role");
        if (role < 1 || role > 3) {
            throw new MyriadException.Protocol("unknown role tag " + role);
        }
        String address = in.str("address", ADDRESS_BYTES_MAX);
        int capabilities = in.u8("capabilities");
        int rack = in.u16("rack");
        int switchId = in.u16("switch");
        int stateTag = in.u8("node state");
        long failedEpoch = 0;
        int state;
        switch (stateTag) {
            case 1: state = NodeInfo.ALIVE; break;
            case 2: state = NodeInfo.FAILED; failedEpoch = in.varint("failed epoch"); break;
            case 3: state = NodeInfo.LEFT; break;
            default: throw new MyriadException.Protocol("unknown node state tag " + stateTag);
        }
        long incarnation = in.varintU32("incarnation");
        long joinedEpoch = in.varint("joined epoch");
        boolean released = in.bool("released");
        return new NodeInfo(id, role, address, capabilities, rack, switchId, state, failedEpoch,
                incarnation, joinedEpoch, released);
    }

    private static List<NodeInfo> records(Decoder in) {
        int count = in.count("nodes", RECORD_BYTES_MIN, NODES_MAX);
        List<NodeInfo> records = new ArrayList<>(count);
        for (int i = 0; i < count; i++) {
            records.add(record(in));
        }
        return records;
    }

    private static MetaResponse embeddedResponse(Decoder in, String what) {
        byte[] bytes = in.bytes(what, EMBEDDED_BYTES_MAX);
        Decoder inner = new Decoder(bytes);
        MetaResponse response = response(inner);
        inner.finish();
        return response;
    }

    private static MetaResponse response(Decoder in) {
        int tag = in.u8("response tag");
        MetaResponse out = new MetaResponse(tag);
        switch (tag) {
            case MetaResponse.DONE:
                break;
            case MetaResponse.JOINED:
                out.values = new long[] {in.varintU16("node"), in.varintU32("incarnation"), in.varint("epoch")};
                break;
            case MetaResponse.EPOCH:
                out.values = new long[] {in.varint("epoch")};
                break;
            case MetaResponse.BARRIER_ALLOCATED:
                out.values = new long[] {in.varintU32("barrier")};
                break;
            case MetaResponse.BARRIER: {
                out.values = new long[] {in.varint("round"), in.varintU32("signed"), in.varintU32("size")};
                if (in.bool("released flag")) {
                    int count = in.count("values", 9, BARRIER_SIZE_MAX);
                    out.released = new LinkedHashMap<>();
                    for (int i = 0; i < count; i++) {
                        int node = in.varintU16("node");
                        out.released.put(node, in.u64("value"));
                    }
                }
                break;
            }
            case MetaResponse.ERROR:
                out.error = metaError(in);
                break;
            default:
                throw new MyriadException.Protocol("unknown response tag " + tag);
        }
        return out;
    }

    private static MetaError metaError(Decoder in) {
        int tag = in.u8("error tag");
        for (MetaError.Kind kind : MetaError.Kind.values()) {
            if (kind.tag != tag) {
                continue;
            }
            switch (kind) {
                case UNKNOWN_NODE: case NODE_NOT_ALIVE: case NODE_ALIVE: case RECLAIM_REFUSED:
                case ALREADY_SIGNED_ON:
                    return new MetaError(kind, in.varintU16("node"), -1, null);
                case INVALID_ARGUMENT: case NAME_NOT_FOUND: case TMP_NOT_FOUND: case TMP_EXISTS:
                    return new MetaError(kind, -1, -1, in.str("text", META_TEXT_MAX));
                case BARRIER_NOT_FOUND:
                    return new MetaError(kind, -1, in.varintU32("barrier"), null);
                case ZONE_NOT_FOUND: {
                    int owner = in.varintU16("owner");
                    return new MetaError(kind, owner, in.varintU32("zone"), null);
                }
                default:
                    return new MetaError(kind, -1, -1, null);
            }
        }
        throw new MyriadException.Protocol("unknown error tag " + tag);
    }

    /** Decodes a metadata reply. */
    public static MetaReply decodeReply(byte[] payload) {
        Decoder in = new Decoder(payload);
        int tag = in.u8("metadata reply tag");
        MetaReply reply = new MetaReply(tag);
        switch (tag) {
            case MetaReply.RESPONSE:
                reply.response = embeddedResponse(in, "response");
                break;
            case MetaReply.LOOKUP:
                reply.lookup = new long[] {in.u16("node"), in.varint("first"), in.varint("last"), in.u16("node")};
                break;
            case MetaReply.LOOKUP_TREE: {
                int count = in.count("lookup ranges", 4, LOOKUP_RANGES_MAX);
                reply.ranges = new long[count * 3];
                for (int i = 0; i < count; i++) {
                    reply.ranges[3 * i] = in.varint("first");
                    reply.ranges[3 * i + 1] = in.varint("last");
                    reply.ranges[3 * i + 2] = in.u16("node");
                }
                break;
            }
            case MetaReply.NAME:
                reply.present = in.bool("option");
                if (reply.present) {
                    reply.cid = in.u64("CID");
                }
                break;
            case MetaReply.NAMES: {
                int count = in.count("names", 9, NAMES_MAX);
                reply.names = new LinkedHashMap<>();
                for (int i = 0; i < count; i++) {
                    String name = in.str("name", NAME_BYTES_MAX);
                    reply.names.put(name, in.u64("CID"));
                }
                break;
            }
            case MetaReply.TMP:
                reply.present = in.bool("option");
                if (reply.present) {
                    reply.blob = in.bytes("tmp blob", TMP_BLOB_BYTES_MAX);
                }
                break;
            case MetaReply.TMP_LIST: {
                int count = in.count("tmp blobs", 2, NAMES_MAX);
                reply.sizes = new LinkedHashMap<>();
                for (int i = 0; i < count; i++) {
                    String name = in.str("tmp name", NAME_BYTES_MAX);
                    reply.sizes.put(name, in.varint("tmp blob size"));
                }
                break;
            }
            case MetaReply.BARRIER:
                reply.present = in.bool("option");
                if (reply.present) {
                    long size = in.varintU32("barrier size");
                    long round = in.varint("round");
                    long signed = in.varintU32("signed");
                    reply.barrier = new BarrierStatus(size, round, signed, values(in));
                }
                break;
            case MetaReply.NODES:
                reply.nodes = records(in);
                break;
            case MetaReply.ZONES: {
                int count = in.count("zones", 2, ZONES_PER_NODE_MAX);
                reply.zones = new LinkedHashMap<>();
                for (int i = 0; i < count; i++) {
                    long zone = in.varintU32("zone");
                    int backups = in.count("backups", 2, BACKUPS_PER_ZONE_MAX);
                    List<Integer> list = new ArrayList<>(backups);
                    for (int b = 0; b < backups; b++) {
                        list.add(in.u16("node"));
                    }
                    reply.zones.put(zone, list);
                }
                break;
            }
            case MetaReply.STATUS: {
                int node = in.u16("node");
                long epoch = in.varint("epoch");
                int leader = optionNode(in);
                long term = in.varint("term");
                long lastLog = optionU64(in);
                long lastApplied = optionU64(in);
                reply.status = new long[] {node, epoch, leader, term, lastLog, lastApplied};
                int count = in.count("superpeers", 3, SUPERPEERS_MAX);
                reply.members = new LinkedHashMap<>();
                for (int i = 0; i < count; i++) {
                    int id = in.u16("node");
                    reply.members.put(id, in.str("address", ADDRESS_BYTES_MAX));
                }
                break;
            }
            case MetaReply.NOT_LEADER:
                reply.leader = optionNode(in);
                break;
            case MetaReply.UNAVAILABLE:
                reply.reason = in.str("reason", REASON_BYTES_MAX);
                break;
            case MetaReply.BASES:
                reply.bases = new long[] {in.varintU32("zone base"), in.varintU32("zones end"),
                    in.varint("lid base"), in.varint("lids reserved")};
                break;
            default:
                throw new MyriadException.Protocol("unknown metadata reply tag " + tag);
        }
        in.finish();
        return reply;
    }
}
