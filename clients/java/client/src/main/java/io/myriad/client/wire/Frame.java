package io.myriad.client.wire;

import io.myriad.client.MyriadException;

/**
 * The 12-byte frame header of {@code docs/wire-format.md} section 2 ({@code crates/net/src/wire.rs}):
 * flags, type, subtype, marker 0x4d, message ID (u32 LE), payload length (u32 LE, at most
 * 1 MiB). Immutable.
 */
public final class Frame {
    /** Bytes of a header. */
    public static final int HEADER_BYTES = 12;
    /** Header byte 3. */
    public static final int MARKER = 0x4d;
    /** Largest payload of one frame (1 MiB); larger messages are fragmented. */
    public static final int PAYLOAD_BYTES_MAX = 1 << 20;

    /** Kind: one-way message. */
    public static final int KIND_MESSAGE = 0;
    /** Kind: request. */
    public static final int KIND_REQUEST = 1;
    /** Kind: response. */
    public static final int KIND_RESPONSE = 2;

    private static final int FLAG_KIND_MASK = 0b11;
    private static final int FLAG_ORDERED = 0b100;
    private static final int FLAG_FRAGMENT = 0b1000;
    private static final int FLAG_LAST = 0b1_0000;
    private static final int FLAG_RESERVED = 0b1110_0000;

    /** Fragment position: the frame is the whole message. */
    public static final int WHOLE = 0;
    /** Fragment position: a piece with more to come. */
    public static final int MORE = 1;
    /** Fragment position: the last piece. */
    public static final int LAST = 2;

    /** Message, request or response ({@code KIND_*}). */
    public final int kind;
    /** Whether the type is ordered. */
    public final boolean ordered;
    /** {@link #WHOLE}, {@link #MORE} or {@link #LAST}. */
    public final int fragment;
    /** Type byte. */
    public final int type;
    /** Subtype byte. */
    public final int subtype;
    /** Message ID (32 bits). */
    public final int messageId;
    /** Payload bytes following the header. */
    public final int payloadBytes;

    /** A header with these fields. */
    public Frame(int kind, boolean ordered, int fragment, int type, int subtype, int messageId,
            int payloadBytes) {
        this.kind = kind;
        this.ordered = ordered;
        this.fragment = fragment;
        this.type = type;
        this.subtype = subtype;
        this.messageId = messageId;
        this.payloadBytes = payloadBytes;
    }

    /** Writes the 12 header bytes at {@code out[offset..]}. */
    public void encode(byte[] out, int offset) {
        int flags = kind;
        if (ordered) {
            flags |= FLAG_ORDERED;
        }
        if (fragment == MORE) {
            flags |= FLAG_FRAGMENT;
        } else if (fragment == LAST) {
            flags |= FLAG_FRAGMENT | FLAG_LAST;
        }
        out[offset] = (byte) flags;
        out[offset + 1] = (byte) type;
        out[offset + 2] = (byte) subtype;
        out[offset + 3] = (byte) MARKER;
        for (int i = 0; i < 4; i++) {
            out[offset + 4 + i] = (byte) (messageId >>> (8 * i));
            out[offset + 8 + i] = (byte) (payloadBytes >>> (8 * i));
        }
    }

    /** The 12 header bytes. */
    public byte[] encode() {
        byte[] out = new byte[HEADER_BYTES];
        encode(out, 0);
        return out;
    }

    /**
     * Parses and validates 12 header bytes at {@code in[offset..]}; the only exception is
     * {@link MyriadException.Protocol} (bad marker, flags, or a length above 1 MiB).
     */
    public static Frame decode(byte[] in, int offset) {
        if (in.length - offset < HEADER_BYTES) {
            throw new MyriadException.Protocol("frame header truncated");
        }
        int flags = in[offset] & 0xff;
        int marker = in[offset + 3] & 0xff;
        if (marker != MARKER) {
            throw new MyriadException.Protocol("bad frame marker " + marker);
        }
        if ((flags & FLAG_RESERVED) != 0 || (flags & FLAG_KIND_MASK) == 3) {
            throw new MyriadException.Protocol("bad frame flags " + flags);
        }
        boolean fragmentFlag = (flags & FLAG_FRAGMENT) != 0;
        boolean lastFlag = (flags & FLAG_LAST) != 0;
        int fragment;
        if (!fragmentFlag && lastFlag) {
            throw new MyriadException.Protocol("bad frame flags " + flags);
        } else if (!fragmentFlag) {
            fragment = WHOLE;
        } else {
            fragment = lastFlag ? LAST : MORE;
        }
        int id = 0;
        long length = 0;
        for (int i = 0; i < 4; i++) {
            id |= (in[offset + 4 + i] & 0xff) << (8 * i);
            length |= (long) (in[offset + 8 + i] & 0xff) << (8 * i);
        }
        if (length > PAYLOAD_BYTES_MAX) {
            throw new MyriadException.Protocol("frame length " + length + " above " + PAYLOAD_BYTES_MAX);
        }
        return new Frame(flags & FLAG_KIND_MASK, (flags & FLAG_ORDERED) != 0, fragment,
                in[offset + 1] & 0xff, in[offset + 2] & 0xff, id, (int) length);
    }

    @Override
    public boolean equals(Object other) {
        if (!(other instanceof Frame)) {
            return false;
        }
        Frame f = (Frame) other;
        return kind == f.kind && ordered == f.ordered && fragment == f.fragment && type == f.type
                && subtype == f.subtype && messageId == f.messageId && payloadBytes == f.payloadBytes;
    }

    @Override
    public int hashCode() {
        return java.util.Objects.hash(kind, ordered, fragment, type, subtype, messageId, payloadBytes);
    }

    @Override
    public String toString() {
        return "Frame{kind=" + kind + ", ordered=" + ordered + ", fragment=" + fragment + ", type="
                + type + "." + subtype + ", id=" + messageId + ", bytes=" + payloadBytes + "}";
    }
}
