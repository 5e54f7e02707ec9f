package io.myriad.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Every call ends within its timeout when the node it needs stops answering: a peer and
 * then the only superpeer are frozen with SIGSTOP (and thawed with SIGCONT before the
 * cluster is killed; SIGKILL ends a stopped process anyway).
 */
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class TimeoutTest {
    static void signal(LocalCluster.Node node, String name) throws Exception {
        Process kill = new ProcessBuilder("kill", "-" + name, String.valueOf(node.process.pid())).start();
        assertTrue(kill.waitFor(5, TimeUnit.SECONDS) && kill.exitValue() == 0, "kill -" + name);
    }

    static long millisOf(Runnable call) {
        long started = System.nanoTime();
        try {
            call.run();
            fail("the call succeeded against a frozen node");
        } catch (MyriadException.Timeout | MyriadException.NodeUnavailable | MyriadException.SuperpeersUnavailable e) {
            // a typed error, as documented
        }
        return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
    }

    @Test
    void callsToFrozenNodesEndWithTypedErrorsWithinTheirTimeouts() throws Exception {
        try (LocalCluster cluster = LocalCluster.start(1, 1, List.of("--memory-mb", "64", "--zone-mb", "16",
                "--prefault-mb", "0"), null)) {
            ClientConfig config = cluster.config();
            config.chunkTimeout = Duration.ofMillis(500);
            config.metaTimeout = Duration.ofMillis(800);
            try (MyriadClient client = MyriadClient.connect(config)) {
                long cid = client.createWithData(client.peers().get(0), new byte[] {1, 2, 3});
                LocalCluster.Node peer = cluster.nodes().stream().filter(n -> n.name.equals("peer-1")).findFirst().orElseThrow();
                LocalCluster.Node superpeer = cluster.nodes().get(0);

                signal(peer, "STOP");
                try {
                    long took = millisOf(() -> client.get(cid));
                    assertTrue(took < 2_000, "a get of a frozen peer's chunk ended after " + took + " ms");
                    CompletableFuture<byte[]> async = client.getAsync(cid);
                    try {
                        async.get(3, TimeUnit.SECONDS);
                        fail("the async get succeeded against a frozen peer");
                    } catch (java.util.concurrent.ExecutionException expected) {
                        assertTrue(expected.getCause() instanceof MyriadException, expected.toString());
                    }
                } finally {
                    signal(peer, "CONT");
                }

                signal(superpeer, "STOP");
                try {
                    long took = millisOf(() -> client.nameGet("anything"));
                    assertTrue(took < 2_500, "a metadata call to a frozen superpeer ended after " + took + " ms");
                } finally {
                    signal(superpeer, "CONT");
                }
                // Both answer again (the peer may have been declared failed meanwhile: then its
                // chunk is gone with it, which is also a typed answer).
                try {
                    assertArrayEquals(new byte[] {1, 2, 3}, client.get(cid));
                } catch (MyriadException.NodeUnavailable | MyriadException.Timeout tolerated) {
                    // the peer was fenced while frozen
                }
            }
        }
    }
}
