package io.myriad.client.proto;

import io.myriad.client.MyriadException;
import io.myriad.client.wire.Decoder;
import io.myriad.client.wire.Encoder;
import java.util.List;

/**
 * Chunk requests (message type 20.0) and their replies, byte for byte as
 * {@code crates/proto/src/chunk.rs} (documented in {@code docs/protocol.md}). Requests are
 * encoded by static methods; {@link #decodeReply} turns a reply payload into a
 * {@link ChunkReply} and throws nothing but {@link MyriadException.Protocol}.
 */
public final class ChunkProto {
    /** Most items in one batch. */
    public static final int BATCH_ITEMS_MAX = 1 << 20;
    /** Largest chunk payload a message may carry. */
    public static final int CHUNK_BYTES_MAX = 64 << 20;
    /** Longest status text. */
    public static final int STATUS_TEXT_BYTES_MAX = 4096;

    static final int CREATE = 1;
    static final int CREATE_WITH_DATA = 2;
    static final int GET = 3;
    static final int PUT = 4;
    static final int REMOVE = 5;
    static final int INSERT = 6;
    static final int READ_AT = 7;
    static final int WRITE_AT = 8;
    static final int RESIZE = 9;
    static final int LOCK = 10;
    static final int UNLOCK = 11;
    static final int STATUS = 12;
    static final int LIST = 13;
    static final int STATS = 14;

    private ChunkProto() {}

    /** Create zeroed chunks of these sizes. */
    public static byte[] create(int durability, long[] sizes) {
        Encoder out = new Encoder(8 + sizes.length * 3).u8(CREATE).u8(durability).varint(sizes.length);
        for (long size : sizes) {
            out.varint(size);
        }
        return out.toByteArray();
    }

    /** Create chunks holding these payloads. */
    public static byte[] createWithData(int durability, List<byte[]> payloads) {
        int hint = 8;
        for (byte[] p : payloads) {
            hint += p.length + 5;
        }
        Encoder out = new Encoder(hint).u8(CREATE_WITH_DATA).u8(durability).varint(payloads.size());
        for (byte[] payload : payloads) {
            out.bytes(payload);
        }
        return out.toByteArray();
    }

    private static byte[] cids(int tag, int durability, long[] cids) {
        Encoder out = new Encoder(8 + cids.length * 8).u8(tag);
        if (durability >= 0) {
            out.u8(durability);
        }
        out.varint(cids.length);
        for (long cid : cids) {
            out.u64(cid);
        }
        return out.toByteArray();
    }

    /** Read whole chunks. */
    public static byte[] get(long[] cids) {
        return cids(GET, -1, cids);
    }

    /** Remove chunks. */
    public static byte[] remove(int durability, long[] cids) {
        return cids(REMOVE, durability, cids);
    }

    /** Sizes of chunks. */
    public static byte[] status(long[] cids) {
        return cids(STATUS, -1, cids);
    }

    private static byte[] items(int tag, int durability, long[] cids, byte[][] data) {
        int hint = 8;
        for (byte[] d : data) {
            hint += d.length + 13;
        }
        Encoder out = new Encoder(hint).u8(tag).u8(durability).varint(cids.length);
        for (int i = 0; i < cids.length; i++) {
            out.u64(cids[i]).bytes(data[i]);
        }
        return out.toByteArray();
    }

    /** Replace whole chunks ({@code data[i]} for {@code cids[i]}). */
    public static byte[] put(int durability, long[] cids, byte[][] data) {
        return items(PUT, durability, cids, data);
    }

    /** Store chunks under given IDs. */
    public static byte[] insert(int durability, long[] cids, byte[][] data) {
        return items(INSERT, durability, cids, data);
    }

    /** Read {@code len} bytes at {@code offset}. */
    public static byte[] readAt(long cid, long offset, long len) {
        return new Encoder(24).u8(READ_AT).u64(cid).varint(offset).varint(len).toByteArray();
    }

    /** Overwrite bytes at {@code offset}. */
    public static byte[] writeAt(int durability, long cid, long offset, byte[] data) {
        return new Encoder(24 + data.length).u8(WRITE_AT).u8(durability).u64(cid).varint(offset)
                .bytes(data).toByteArray();
    }

    /** Change a chunk's size. */
    public static byte[] resize(int durability, long cid, long size) {
        return new Encoder(24).u8(RESIZE).u8(durability).u64(cid).varint(size).toByteArray();
    }

    /** Take a chunk's lock, waiting at most {@code timeoutMs} at the owner. */
    public static byte[] lock(long cid, boolean write, long timeoutMs) {
        return new Encoder(24).u8(LOCK).u64(cid).bool(write).varint(timeoutMs).toByteArray();
    }

    /** Release a lock. */
    public static byte[] unlock(long cid, boolean write) {
        return new Encoder(16).u8(UNLOCK).u64(cid).bool(write).toByteArray();
    }

    /** The CID ranges a peer holds ({@code creator} -1: all creators). */
    public static byte[] list(int creator, long max) {
        Encoder out = new Encoder(16).u8(LIST);
        if (creator >= 0) {
            out.u8(1).u16(creator);
        } else {
            out.u8(0);
        }
        return out.varint(max).toByteArray();
    }

    /** A peer's memory summary. */
    public static byte[] stats() {
        return new byte[] {STATS};
    }

    /** A migration of {@code first..=last} (one creator) to peer {@code to} (message type 20.1). */
    public static byte[] migrate(long first, long last, int to) {
        return new Encoder(18).u64(first).u64(last).u16(to).toByteArray();
    }

    /**
     * Decodes a migration reply: the number of chunks moved, or -1 with the peer's reason in
     * {@code reason[0]}.
     */
    public static long decodeMigrateReply(byte[] payload, String[] reason) {
        Decoder in = new Decoder(payload);
        int tag = in.u8("migrate reply tag");
        long moved;
        if (tag == 0) {
            moved = in.varint("moved chunks");
        } else if (tag == 1) {
            reason[0] = in.str("failure reason");
            moved = -1;
        } else {
            throw new MyriadException.Protocol("unknown migrate reply tag " + tag);
        }
        in.finish();
        return moved;
    }

    private static String text(Decoder in) {
        return in.str("status text", STATUS_TEXT_BYTES_MAX);
    }

    private static ItemError errorAfterTag(Decoder in, int tag) {
        switch (tag) {
            case ItemError.NOT_FOUND:
            case ItemError.NOT_OWNER:
            case ItemError.TOO_LARGE:
            case ItemError.OUT_OF_MEMORY:
            case ItemError.LOCK_TIMEOUT:
                return new ItemError(tag, null);
            case ItemError.INVALID:
            case ItemError.INTERNAL:
                return new ItemError(tag, text(in));
            default:
                throw new MyriadException.Protocol("unknown item status tag " + tag);
        }
    }

    private static byte[] payload(Decoder in) {
        return in.bytes("chunk payload", CHUNK_BYTES_MAX);
    }

    /** Decodes a reply; the only exception is {@link MyriadException.Protocol}. */
    public static ChunkReply decodeReply(byte[] payload) {
        Decoder in = new Decoder(payload);
        int tag = in.u8("chunk reply tag");
        ChunkReply reply = new ChunkReply(tag);
        switch (tag) {
            case ChunkReply.CREATED: {
                int count = in.count("CID count", 8, BATCH_ITEMS_MAX);
                reply.cids = new long[count];
                for (int i = 0; i < count; i++) {
                    reply.cids[i] = in.u64("CID");
                }
                break;
            }
            case ChunkReply.DATA: {
                int count = in.count("item count", 1, BATCH_ITEMS_MAX);
                reply.data = new byte[count][];
                reply.errors = new ItemError[count];
                for (int i = 0; i < count; i++) {
                    int status = in.u8("item status");
                    if (status == 0) {
                        reply.data[i] = payload(in);
                    } else {
                        reply.errors[i] = errorAfterTag(in, status);
                    }
                }
                break;
            }
            case ChunkReply.STATUSES: {
                int count = in.count("status count", 1, BATCH_ITEMS_MAX);
                reply.errors = new ItemError[count];
                for (int i = 0; i < count; i++) {
                    int status = in.u8("item status");
                    if (status != 0) {
                        reply.errors[i] = errorAfterTag(in, status);
                    }
                }
                break;
            }
            case ChunkReply.SIZES: {
                int count = in.count("size count", 1, BATCH_ITEMS_MAX);
                reply.sizes = new long[count];
                reply.errors = new ItemError[count];
                for (int i = 0; i < count; i++) {
                    int status = in.u8("item status");
                    if (status == 0) {
                        reply.sizes[i] = in.varint("size");
                    } else {
                        reply.errors[i] = errorAfterTag(in, status);
                    }
                }
                break;
            }
            case ChunkReply.RANGES: {
                reply.truncated = in.bool("truncated flag");
                int count = in.count("range count", 16, BATCH_ITEMS_MAX);
                reply.ranges = new long[count * 2];
                for (int i = 0; i < count * 2; i++) {
                    reply.ranges[i] = in.u64("CID");
                }
                break;
            }
            case ChunkReply.STATS: {
                reply.stats = new long[7];
                String[] names = {"chunks", "payload bytes", "used bytes", "free bytes",
                    "region bytes", "rereplication pending", "requests served"};
                for (int i = 0; i < 7; i++) {
                    reply.stats[i] = in.varint(names[i]);
                }
                break;
            }
            case ChunkReply.FAILED: {
                int status = in.u8("item status");
                if (status == 0) {
                    throw new MyriadException.Protocol("failure reply with status ok");
                }
                reply.failed = errorAfterTag(in, status);
                break;
            }
            case ChunkReply.MALFORMED:
                reply.malformed = text(in);
                break;
            default:
                throw new MyriadException.Protocol("unknown chunk reply tag " + tag);
        }
        in.finish();
        return reply;
    }
}
