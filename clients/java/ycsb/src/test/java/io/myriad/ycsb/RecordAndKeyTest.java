package io.myriad.ycsb;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.myriad.client.ChunkIds;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.jupiter.api.Test;

/** The record encoding and the key scheme, without a cluster. */
class RecordAndKeyTest {
    @Test
    void recordsRoundTripAndYcsbFieldNamesCostOneByte() {
        Map<String, byte[]> record = new LinkedHashMap<>();
        record.put("field0", new byte[64]);
        assertEquals(67, RecordCodec.encode(record).length);
        record.put("field12", "x".getBytes(StandardCharsets.UTF_8));
        record.put("other name ü", new byte[0]);
        record.put("field01", new byte[] {1});
        record.put("field", new byte[] {2});
        Map<String, byte[]> back = RecordCodec.decode(RecordCodec.encode(record));
        assertEquals(record.keySet(), back.keySet());
        for (String name : record.keySet()) {
            assertArrayEquals(record.get(name), back.get(name), name);
        }
    }

    @Test
    void malformedRecordsAreRefusedWithIllegalArgument() {
        Random random = new Random(7);
        for (int i = 0; i < 20_000; i++) {
            byte[] input = new byte[random.nextInt(24)];
            random.nextBytes(input);
            try {
                RecordCodec.decode(input);
            } catch (IllegalArgumentException expected) {
                // the only allowed failure
            }
        }
        assertThrows(IllegalArgumentException.class, () -> RecordCodec.decode(new byte[] {1, 0, 5, 1}));
    }

    @Test
    void keysMapToPeersRoundRobinAboveTheLidBase() {
        KeyScheme scheme = new KeyScheme(List.of(2, 3));
        assertEquals(ChunkIds.of(2, KeyScheme.LID_BASE), scheme.cid("user0"));
        assertEquals(ChunkIds.of(3, KeyScheme.LID_BASE), scheme.cid("user1"));
        assertEquals(ChunkIds.of(2, KeyScheme.LID_BASE + 5), scheme.cid("user10"));
        assertEquals(ChunkIds.of(3, KeyScheme.LID_BASE + 500), scheme.cid("user1001"));
        assertThrows(IllegalArgumentException.class, () -> scheme.cid("user"));
        assertThrows(IllegalArgumentException.class, () -> scheme.cid("user6284781860667377211"));
    }
}
