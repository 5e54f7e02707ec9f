package io.myriad.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Routing after a migration: the client's cache is emptied, every CID goes to its creator
 * first, which answers "not owner"; the client looks the range up and finds the chunks at
 * the new owner. On a cluster of its own: after a migration the source peer hands the
 * moved local IDs out again (see the report of issue 20), which would confuse other tests
 * that create chunks there.
 */
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class MigrationRoutingTest {
    static LocalCluster cluster;
    static MyriadClient client;

    @BeforeAll
    static void start() throws Exception {
        cluster = LocalCluster.start(1, 2, List.of("--memory-mb", "64", "--zone-mb", "16", "--prefault-mb", "0",
                "--replication", "1"), null);
        client = MyriadClient.connect(cluster.config());
    }

    @AfterAll
    static void stop() {
        try {
            if (client != null) {
                client.close();
            }
        } finally {
            if (cluster != null) {
                cluster.close();
            }
        }
    }

    static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    @Test
    void afterAMigrationNotOwnerAnswersRefreshTheRoute() {
        List<Integer> peers = client.peers();
        int from = peers.get(0);
        int to = peers.get(1);
        List<byte[]> payloads = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            payloads.add(bytes(String.format("moving-%02d", i)));
        }
        long[] cids = client.createWithData(from, payloads, null);
        for (int i = 1; i < cids.length; i++) {
            assertEquals(cids[i - 1] + 1, cids[i], "fresh chunks of one create are consecutive");
        }
        assertEquals(20, client.migrate(cids[0], cids[19], to));
        // The cache is empty: every CID goes to its creator first, which answers "not owner".
        List<ItemResult<byte[]>> got = client.getBatch(cids);
        for (int i = 0; i < 20; i++) {
            assertArrayEquals(payloads.get(i), got.get(i).get());
        }
        client.put(cids[3], bytes("MOVING-03"));
        try (MyriadClient fresh = MyriadClient.connect(cluster.config())) {
            assertArrayEquals(bytes("MOVING-03"), fresh.get(cids[3]));
            assertArrayEquals(payloads.get(7), fresh.get(cids[7]));
        }
        boolean[] truncated = new boolean[1];
        long[] onTarget = client.list(to, from, 100, truncated);
        assertTrue(onTarget.length >= 2 && onTarget[0] <= cids[0] && cids[19] <= onTarget[onTarget.length - 1],
                "the target lists the moved range");
    }

}
