package io.myriad.client.wire;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * Writes payload fields exactly as {@code myriad_types::codec::Encoder}: integers
 * little-endian, LEB128 varints, length-prefixed byte strings (see
 * {@code docs/wire-format.md} section 4). Not thread-safe; one per message.
 */
public final class Encoder {
    private byte[] buf;
    private int length;

    /** An empty encoder. */
    public Encoder() {
        this(64);
    }

    /** An empty encoder with room for {@code capacity} bytes. */
    public Encoder(int capacity) {
        buf = new byte[Math.max(16, capacity)];
    }

    private void room(int more) {
        if (length + more > buf.length) {
            buf = Arrays.copyOf(buf, Math.max(buf.length * 2, length + more));
        }
    }

    /** One byte (the low 8 bits of {@code value}). */
    public Encoder u8(int value) {
        room(1);
        buf[length++] = (byte) value;
        return this;
    }

    /** A boolean: 1 or 0. */
    public Encoder bool(boolean value) {
        return u8(value ? 1 : 0);
    }

    /** 2 bytes little-endian. */
    public Encoder u16(int value) {
        room(2);
        buf[length++] = (byte) value;
        buf[length++] = (byte) (value >>> 8);
        return this;
    }

    /** 4 bytes little-endian. */
    public Encoder u32(int value) {
        room(4);
        for (int i = 0; i < 4; i++) {
            buf[length++] = (byte) (value >>> (8 * i));
        }
        return this;
    }

    /** 8 bytes little-endian (a u64 in two's complement). */
    public Encoder u64(long value) {
        room(8);
        for (int i = 0; i < 8; i++) {
            buf[length++] = (byte) (value >>> (8 * i));
        }
        return this;
    }

    /** An unsigned LEB128 varint of the 64 bits of {@code value}. */
    public Encoder varint(long value) {
        room(10);
        while ((value & ~0x7fL) != 0) {
            buf[length++] = (byte) ((value & 0x7f) | 0x80);
            value >>>= 7;
        }
        buf[length++] = (byte) value;
        return this;
    }

    /** A varint length, then the bytes. */
    public Encoder bytes(byte[] data) {
        return bytes(data, 0, data.length);
    }

    /** A varint length, then {@code count} bytes of {@code data} from {@code offset}. */
    public Encoder bytes(byte[] data, int offset, int count) {
        varint(count);
        return raw(data, offset, count);
    }

    /** A UTF-8 string as bytes. */
    public Encoder str(String text) {
        return bytes(text.getBytes(StandardCharsets.UTF_8));
    }

    /** The bytes with no length prefix. */
    public Encoder raw(byte[] data, int offset, int count) {
        room(count);
        System.arraycopy(data, offset, buf, length, count);
        length += count;
        return this;
    }

    /** Bytes written so far. */
    public int length() {
        return length;
    }

    /** A copy of the bytes written. */
    public byte[] toByteArray() {
        return Arrays.copyOf(buf, length);
    }
}
