package io.myriad.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.myriad.client.net.Endpoint;
import io.myriad.client.net.MessageType;
import io.myriad.client.net.Tls;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * TLS against a real cluster started with TLS ({@link LocalCluster#startTls}: the
 * certificates written by the binary's {@code myriad cert}, every node with
 * {@code --tls-dir}): the client loads the PEM files with the JDK alone, reads and writes
 * chunks and metadata, stays alive through the superpeer's heartbeats (which dial it: its
 * TLS acceptor), and interoperates with the Rust client; a plaintext client, a client of
 * another CA and a client with the wrong secret are refused, and the cluster serves on.
 */
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class TlsTest {
    private static LocalCluster cluster;
    @TempDir
    static Path scratch;
    private static Path foreign;

    @BeforeAll
    static void start() throws IOException {
        cluster = LocalCluster.startTls(1, 2, List.of("--memory-mb", "64", "--zone-mb", "16", "--prefault-mb", "0",
                "--replication", "1"));
        // A second CA with a client certificate of the same name and role.
        foreign = scratch.resolve("foreign");
        LocalCluster.cert("ca", foreign.toString());
        LocalCluster.cert("issue", foreign.toString(), "client", "--role", "client");
    }

    @AfterAll
    static void stop() {
        if (cluster != null) {
            cluster.close();
        }
    }

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    /** A configuration that joins quickly or fails quickly (for refusals). */
    private static ClientConfig shortConfig() {
        ClientConfig config = ClientConfig.of(cluster.superpeers()).withSecretFile(cluster.secretFile());
        config.metaTimeout = Duration.ofSeconds(3);
        config.connectTimeout = Duration.ofSeconds(1);
        return config;
    }

    @Test
    void aTlsClientReadsAndWritesAndAnIdleOneStaysAliveThroughHeartbeats() throws Exception {
        try (MyriadClient idle = MyriadClient.connect(cluster.config())) {
            // Several failure timeouts (1 s) without a request of its own: only the heartbeats
            // the superpeer sends it (dialing its TLS acceptor) keep it alive.
            Thread.sleep(3_000);
            try (MyriadClient client = MyriadClient.connect(cluster.config())) {
                List<Integer> peers = client.peers();
                assertEquals(2, peers.size(), "peers: " + peers);
                long first = client.createWithData(peers.get(0), bytes("over tls, peer 1"));
                long second = client.createWithData(peers.get(1), bytes("over tls, peer 2"));
                List<ItemResult<byte[]>> both = client.getBatch(new long[] {first, second});
                assertArrayEquals(bytes("over tls, peer 1"), both.get(0).get());
                assertArrayEquals(bytes("over tls, peer 2"), both.get(1).get());
                client.put(first, bytes("OVER TLS, PEER 1"));
                client.nameRegister("tls", first);
                assertEquals(first, client.nameGet("tls"));

                NodeInfo me = client.nodes().stream().filter(n -> n.id() == idle.nodeId()).findFirst().orElseThrow();
                assertTrue(me.isAlive(), "the idle TLS client answered the heartbeats: " + me);
                assertArrayEquals(bytes("OVER TLS, PEER 1"), idle.get(first));
            }
        }
    }

    @Test
    void theRustClientReadsWhatTheJavaClientWroteOverTls() throws Exception {
        long cid;
        try (MyriadClient client = MyriadClient.connect(cluster.config())) {
            cid = client.createWithData(client.peers().get(0), bytes("java wrote"));
        }
        Path out = Files.createTempFile("term-", ".txt");
        try {
            List<String> command = new ArrayList<>(List.of(LocalCluster.binary().toString(), "term", "--superpeers",
                    cluster.superpeers(), "--secret-file", cluster.secretFile().toString(), "--tls-dir",
                    cluster.tlsDir().toString(), "--tls-name", "client", "--json", "-c",
                    "chunkget " + ChunkIds.format(cid)));
            Process process = new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(out.toFile())
                    .start();
            try {
                assertTrue(process.waitFor(30, TimeUnit.SECONDS), "myriad term ended");
            } finally {
                process.destroyForcibly();
            }
            String text = Files.readString(out, StandardCharsets.UTF_8);
            assertEquals(0, process.exitValue(), text);
            assertTrue(text.contains("\"data\":\"java wrote\""), text);
        } finally {
            Files.deleteIfExists(out);
        }
    }

    @Test
    void aPlaintextClientIsRefusedWithAMessageNamingTls() {
        MyriadException refused = assertThrows(MyriadException.class, () -> MyriadClient.connect(shortConfig()));
        assertTrue(refused.getMessage().contains("requires TLS"), refused.getMessage());
    }

    @Test
    void aCertificateOfAnotherCaOrTheWrongSecretIsRefusedAndTheClusterServesOn() {
        MyriadException otherCa = assertThrows(MyriadException.class,
                () -> MyriadClient.connect(shortConfig().withTlsDir(foreign, "client")));
        assertTrue(otherCa.getMessage().contains("TLS"), otherCa.getMessage());

        ClientConfig wrongSecret = shortConfig().withTlsDir(cluster.tlsDir());
        wrongSecret.secret = bytes("not the cluster secret");
        MyriadException secret = assertThrows(MyriadException.class, () -> MyriadClient.connect(wrongSecret));
        assertTrue(secret.getMessage().contains("wrong secret"), secret.getMessage());

        try (MyriadClient client = MyriadClient.connect(cluster.config())) {
            long cid = client.createWithData(client.peers().get(1), bytes("still serving"));
            assertArrayEquals(bytes("still serving"), client.get(cid));
        }
    }

    @Test
    void theJavaAcceptorRequiresACertificateOfTheClusterCa() throws Exception {
        Tls ours = Tls.fromDir(cluster.tlsDir(), "client");
        Tls theirs = Tls.fromDir(foreign, "client");
        byte[] secret = bytes("endpoint test secret");
        MessageType echo = MessageType.HEARTBEAT;
        int serverId = 0x7f01;
        try (Endpoint server = new Endpoint(serverId, secret, new InetSocketAddress("127.0.0.1", 0), 2_000, ours)) {
            server.register(echo, incoming -> incoming.respond(incoming.payload));
            InetSocketAddress address = server.listenAddress();
            try (Endpoint good = new Endpoint(0x7f02, secret, null, 2_000, ours)) {
                good.setAddress(serverId, address);
                assertArrayEquals(bytes("ping"), good.request(serverId, echo, bytes("ping")).get(10, TimeUnit.SECONDS));
            }
            for (Tls tls : new Tls[] {theirs, null}) {
                try (Endpoint bad = new Endpoint(0x7f03, secret, null, 2_000, tls)) {
                    bad.setAddress(serverId, address);
                    assertThrows(ExecutionException.class,
                            () -> bad.request(serverId, echo, bytes("ping")).get(10, TimeUnit.SECONDS),
                            tls == null ? "plaintext connector" : "connector of another CA");
                }
            }
        }
    }

    @Test
    void pemFilesLoadWithTheJdkAndUnusableOnesAreNamed() throws IOException {
        Path tls = cluster.tlsDir();
        assertTrue(Files.readString(tls.resolve("client.key")).contains("BEGIN PRIVATE KEY"), "PKCS#8");
        Tls.fromPemFiles(tls.resolve("ca.pem"), tls.resolve("peer.pem"), tls.resolve("peer.key"));

        MyriadException missing = assertThrows(MyriadException.InvalidArgument.class,
                () -> Tls.fromDir(tls, "nobody"));
        assertTrue(missing.getMessage().contains("nobody.pem"), missing.getMessage());
        MyriadException mismatched = assertThrows(MyriadException.InvalidArgument.class,
                () -> Tls.fromPemFiles(tls.resolve("ca.pem"), tls.resolve("client.pem"), foreign.resolve("client.key")));
        assertTrue(mismatched.getMessage().contains("does not belong"), mismatched.getMessage());
        Path sec1 = scratch.resolve("sec1.key");
        Files.writeString(sec1, "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIA==\n-----END EC PRIVATE KEY-----\n");
        MyriadException format = assertThrows(MyriadException.InvalidArgument.class,
                () -> Tls.fromPemFiles(tls.resolve("ca.pem"), tls.resolve("client.pem"), sec1));
        assertTrue(format.getMessage().contains("openssl pkcs8"), format.getMessage());
        MyriadException notCa = assertThrows(MyriadException.InvalidArgument.class,
                () -> Tls.fromPemFiles(tls.resolve("client.key"), tls.resolve("client.pem"), tls.resolve("client.key")));
        assertTrue(notCa.getMessage().contains("no certificate"), notCa.getMessage());

        Files.writeString(scratch.resolve("cluster.json"), "{\"secret_file\":\"secret\",\"tls_dir\":\"" + tls + "\"}");
        assertEquals(tls, ClientConfig.clusterTlsDir(scratch));
        assertEquals(null, ClientConfig.clusterTlsDir(scratch.resolve("none")));
    }
}
