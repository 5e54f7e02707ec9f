package io.myriad.ycsb;

import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The compact encoding of one YCSB record in one chunk.
 *
 * <pre>
 * record := count varint | field*count
 * field  := header varint | [name bytes] | value length varint | value bytes
 * header := n &lt;&lt; 1           when the name is "field" + n (n decimal, no leading zeros)
 *         | len &lt;&lt; 1 | 1     otherwise, followed by the name's len UTF-8 bytes
 * </pre>
 *
 * YCSB names its fields {@code field0}, {@code field1}, ...: each costs one header byte,
 * so a record of one 64-byte field (workload G) is 67 bytes. Varints are LEB128 as in the
 * rest of Myriad. {@link #decode} rejects malformed input with
 * {@link IllegalArgumentException} (a chunk that is not a record).
 */
public final class RecordCodec {
    private RecordCodec() {}

    private static int fieldNumber(String name) {
        if (!name.startsWith("field") || name.length() == 5 || name.length() > 14) {
            return -1;
        }
        if (name.charAt(5) == '0' && name.length() > 6) {
            return -1;
        }
        int n = 0;
        for (int i = 5; i < name.length(); i++) {
            char c = name.charAt(i);
            if (c < '0' || c > '9') {
                return -1;
            }
            n = n * 10 + (c - '0');
        }
        return n;
    }

    private static int varintLength(long value) {
        int length = 1;
        while ((value & ~0x7fL) != 0) {
            value >>>= 7;
            length++;
        }
        return length;
    }

    private static int putVarint(byte[] out, int at, long value) {
        while ((value & ~0x7fL) != 0) {
            out[at++] = (byte) ((value & 0x7f) | 0x80);
            value >>>= 7;
        }
        out[at++] = (byte) value;
        return at;
    }

    /** Encodes the fields (in the map's order). */
    public static byte[] encode(Map<String, byte[]> fields) {
        int size = varintLength(fields.size());
        for (Map.Entry<String, byte[]> field : fields.entrySet()) {
            int n = fieldNumber(field.getKey());
            if (n >= 0) {
                size += varintLength((long) n << 1);
            } else {
                int nameLength = field.getKey().getBytes(StandardCharsets.UTF_8).length;
                size += varintLength(((long) nameLength << 1) | 1) + nameLength;
            }
            size += varintLength(field.getValue().length) + field.getValue().length;
        }
        byte[] out = new byte[size];
        int at = putVarint(out, 0, fields.size());
        for (Map.Entry<String, byte[]> field : fields.entrySet()) {
            int n = fieldNumber(field.getKey());
            if (n >= 0) {
                at = putVarint(out, at, (long) n << 1);
            } else {
                byte[] name = field.getKey().getBytes(StandardCharsets.UTF_8);
                at = putVarint(out, at, ((long) name.length << 1) | 1);
                System.arraycopy(name, 0, out, at, name.length);
                at += name.length;
            }
            byte[] value = field.getValue();
            at = putVarint(out, at, value.length);
            System.arraycopy(value, 0, out, at, value.length);
            at += value.length;
        }
        return out;
    }

    /** Decodes a record (fields in stored order). */
    public static Map<String, byte[]> decode(byte[] bytes) {
        int[] at = {0};
        long count = getVarint(bytes, at);
        if (count > bytes.length) {
            throw new IllegalArgumentException("field count " + count + " beyond the record");
        }
        Map<String, byte[]> fields = new LinkedHashMap<>();
        for (long i = 0; i < count; i++) {
            long header = getVarint(bytes, at);
            String name;
            if ((header & 1) == 0) {
                name = "field" + (header >>> 1);
            } else {
                int length = checkedLength(header >>> 1, bytes, at[0]);
                name = new String(bytes, at[0], length, StandardCharsets.UTF_8);
                at[0] += length;
            }
            int length = checkedLength(getVarint(bytes, at), bytes, at[0]);
            byte[] value = new byte[length];
            System.arraycopy(bytes, at[0], value, 0, length);
            at[0] += length;
            fields.put(name, value);
        }
        if (at[0] != bytes.length) {
            throw new IllegalArgumentException((bytes.length - at[0]) + " trailing bytes after the record");
        }
        return fields;
    }

    private static int checkedLength(long length, byte[] bytes, int at) {
        if (length < 0 || length > bytes.length - at) {
            throw new IllegalArgumentException("length " + length + " beyond the record");
        }
        return (int) length;
    }

    private static long getVarint(byte[] bytes, int[] at) {
        long value = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (at[0] >= bytes.length) {
                throw new IllegalArgumentException("record truncated");
            }
            byte b = bytes[at[0]++];
            value |= (long) (b & 0x7f) << shift;
            if ((b & 0x80) == 0) {
                return value;
            }
        }
        throw new IllegalArgumentException("varint too long");
    }
}
