package io.myriad.client.wire;

import io.myriad.client.MyriadException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * Reads payload fields exactly as {@code myriad_types::codec::Decoder} does, with the same
 * refusals: every length is checked against the bytes left before anything is allocated,
 * varints must be minimal and fit 64 bits, booleans are 0 or 1, strings valid UTF-8.
 *
 * <p>Invariant: whatever the input, the only exception a method throws is
 * {@link MyriadException.Protocol} (randomized tests feed it garbage).
 */
public final class Decoder {
    private final byte[] buf;
    private final int end;
    private int position;

    /** A decoder over all of {@code input} (not copied; must not change meanwhile). */
    public Decoder(byte[] input) {
        this(input, 0, input.length);
    }

    /** A decoder over {@code input[offset..offset+count]}. */
    public Decoder(byte[] input, int offset, int count) {
        this.buf = input;
        this.position = offset;
        this.end = offset + count;
    }

    private static MyriadException.Protocol error(String text) {
        return new MyriadException.Protocol(text);
    }

    /** Bytes not read yet. */
    public int remaining() {
        return end - position;
    }

    /** Fails unless every byte was read. */
    public void finish() {
        if (remaining() != 0) {
            throw error(remaining() + " trailing bytes");
        }
    }

    private void need(int count, String what) {
        if (count < 0 || count > remaining()) {
            throw error("input truncated while reading " + what);
        }
    }

    /** One byte, 0..=255. */
    public int u8(String what) {
        need(1, what);
        return buf[position++] & 0xff;
    }

    /** A boolean: 0 or 1, anything else is refused. */
    public boolean bool(String what) {
        int value = u8(what);
        if (value > 1) {
            throw error("unknown " + what + " tag " + value);
        }
        return value == 1;
    }

    /** 2 bytes little-endian, 0..=0xffff. */
    public int u16(String what) {
        need(2, what);
        int value = (buf[position] & 0xff) | ((buf[position + 1] & 0xff) << 8);
        position += 2;
        return value;
    }

    /** 4 bytes little-endian (as a signed int holding the 32 bits). */
    public int u32(String what) {
        need(4, what);
        int value = 0;
        for (int i = 0; i < 4; i++) {
            value |= (buf[position + i] & 0xff) << (8 * i);
        }
        position += 4;
        return value;
    }

    /** 8 bytes little-endian (as a signed long holding the 64 bits). */
    public long u64(String what) {
        need(8, what);
        long value = 0;
        for (int i = 0; i < 8; i++) {
            value |= (long) (buf[position + i] & 0xff) << (8 * i);
        }
        position += 8;
        return value;
    }

    /** An unsigned LEB128 varint (64 bits, as a signed long); minimal encodings only. */
    public long varint(String what) {
        long value = 0;
        for (int index = 0; index < 10; index++) {
            int b = u8(what);
            if (index == 9 && b > 1) {
                throw error("varint overflow in " + what);
            }
            value |= (long) (b & 0x7f) << (7 * index);
            if ((b & 0x80) == 0) {
                if (b == 0 && index > 0) {
                    throw error("varint not minimal in " + what);
                }
                return value;
            }
        }
        throw error("varint overflow in " + what);
    }

    /** A varint of at most {@code max} (unsigned comparison). */
    public long varintMax(String what, long max) {
        long value = varint(what);
        if (Long.compareUnsigned(value, max) > 0) {
            throw error(what + " is " + Long.toUnsignedString(value) + ", more than the limit " + max);
        }
        return value;
    }

    /** A varint that fits 32 bits (unsigned), as a long. */
    public long varintU32(String what) {
        return varintMax(what, 0xffff_ffffL);
    }

    /** A varint that fits 16 bits. */
    public int varintU16(String what) {
        return (int) varintMax(what, 0xffff);
    }

    /**
     * A count of items of at least {@code minItemBytes} each: at most {@code max}, and
     * refused when the bytes left cannot hold that many.
     */
    public int count(String what, int minItemBytes, int max) {
        long value = varintMax(what, max);
        int count = (int) value;
        if ((long) count * Math.max(1, minItemBytes) > remaining()) {
            throw error("input truncated while reading " + what);
        }
        return count;
    }

    /** A length-prefixed byte string of at most {@code max} bytes (copied). */
    public byte[] bytes(String what, int max) {
        long length = varintMax(what, max);
        need((int) length, what);
        byte[] out = Arrays.copyOfRange(buf, position, position + (int) length);
        position += (int) length;
        return out;
    }

    /** A length-prefixed byte string bounded only by the input (copied). */
    public byte[] bytes(String what) {
        return bytes(what, Integer.MAX_VALUE);
    }

    /** A length-prefixed UTF-8 string of at most {@code max} bytes. */
    public String str(String what, int max) {
        long length = varintMax(what, max);
        need((int) length, what);
        try {
            String text = StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(buf, position, (int) length))
                    .toString();
            position += (int) length;
            return text;
        } catch (CharacterCodingException e) {
            throw error("invalid UTF-8 in " + what);
        }
    }

    /** A length-prefixed UTF-8 string bounded only by the input. */
    public String str(String what) {
        return str(what, Integer.MAX_VALUE);
    }
}
