package io.myriad.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Three superpeers: the client stays a live member through heartbeats while idle, and its
 * metadata requests fail over when the leader is SIGKILLed (a new leader is elected; the
 * client follows "not leader" hints and tries the other superpeers).
 */
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class FailoverTest {
    @Test
    void heartbeatsKeepAnIdleClientAliveAndMetadataFailsOverToTheNewLeader() throws Exception {
        try (LocalCluster cluster = LocalCluster.start(3, 1, List.of("--memory-mb", "64", "--zone-mb", "16",
                "--prefault-mb", "0"), null);
                MyriadClient client = MyriadClient.connect(cluster.config())) {
            long cid = client.createWithData(client.peers().get(0), "kept".getBytes(StandardCharsets.UTF_8));
            client.nameRegister("before", cid);

            // Idle for several failure timeouts: the watching superpeer's heartbeats keep it alive.
            Thread.sleep(4_000);
            NodeInfo me = client.nodes().stream().filter(n -> n.id() == client.nodeId()).findFirst().orElseThrow();
            assertTrue(me.isAlive(), "an idle client answering heartbeats stays alive: " + me);

            int leader = client.superpeerStatus().leader();
            assertTrue(leader >= 1 && leader <= 3, "a leader is known: " + leader);
            LocalCluster.Node leaderNode = cluster.nodes().stream().filter(n -> n.id == leader).findFirst().orElseThrow();
            cluster.kill(leaderNode);

            client.nameRegister("after", cid);
            assertEquals(cid, client.nameGet("before"));
            assertEquals(cid, client.nameGet("after"));
            int newLeader = client.superpeerStatus().leader();
            assertNotEquals(leader, newLeader, "a new leader");
            assertArrayEquals("kept".getBytes(StandardCharsets.UTF_8), client.get(cid));
        }
    }
}
