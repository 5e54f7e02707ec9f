package io.myriad.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The Rust client and the Java client on one cluster must agree: what one writes the other
 * reads, byte for byte. The Rust side is {@code myriad term -c ... --json} (the Rust
 * client library behind the terminal), run as a child process.
 */
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class RustInteropTest {
    static String term(LocalCluster cluster, String commands) throws Exception {
        Path out = Files.createTempFile("term-", ".txt");
        try {
            List<String> command = new ArrayList<>(List.of(LocalCluster.binary().toString(), "term", "--superpeers",
                    cluster.superpeers(), "--secret-file", cluster.secretFile().toString(), "--json", "-c", commands));
            Process process = new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(out.toFile()).start();
            try {
                assertTrue(process.waitFor(30, TimeUnit.SECONDS), "myriad term ended");
            } finally {
                process.destroyForcibly();
            }
            String text = Files.readString(out, StandardCharsets.UTF_8);
            assertEquals(0, process.exitValue(), "myriad term -c \"" + commands + "\":\n" + text);
            return text;
        } finally {
            Files.deleteIfExists(out);
        }
    }

    @Test
    void whatOneClientWritesTheOtherReads() throws Exception {
        try (LocalCluster cluster = LocalCluster.start(1, 2, List.of("--memory-mb", "64", "--zone-mb", "16",
                "--prefault-mb", "0"), null);
                MyriadClient client = MyriadClient.connect(cluster.config())) {
            List<Integer> peers = client.peers();
            byte[] fromJava = new byte[40];
            for (int i = 0; i < fromJava.length; i++) {
                fromJava[i] = (byte) (i * 7 + 1);
            }
            long javaChunk = client.createWithData(peers.get(1), fromJava);
            String cid = ChunkIds.format(javaChunk);
            String read = term(cluster, "chunkget " + cid + " hex");
            assertTrue(read.contains("\"data\":\"" + HexFormat.of().formatHex(fromJava) + "\""), read);

            String created = term(cluster, "chunkcreate 5 " + peers.get(0));
            String rustCid = created.replaceAll("(?s).*\"cid\":\"(0x[0-9a-f]{16})\".*", "$1");
            long rustChunk = Long.parseUnsignedLong(rustCid.substring(2), 16);
            assertEquals((int) peers.get(0), ChunkIds.creator(rustChunk), created);
            assertArrayEquals(new byte[5], client.get(rustChunk));
            term(cluster, "chunkput " + rustCid + " 0a0b0c0d0e hex");
            assertArrayEquals(new byte[] {10, 11, 12, 13, 14}, client.get(rustChunk));
            client.put(rustChunk, new byte[] {1, 2, 3, 4, 5});
            assertTrue(term(cluster, "chunkget " + rustCid + " hex").contains("\"data\":\"0102030405\""));

            client.nameRegister("from-java", javaChunk);
            String named = term(cluster, "nameget from-java");
            assertTrue(named.contains("\"cid\":\"" + cid + "\""), named);
            term(cluster, "namereg " + rustCid + " from-rust");
            assertEquals(rustChunk, client.nameGet("from-rust"));

            term(cluster, "chunkremove " + cid);
            org.junit.jupiter.api.Assertions.assertThrows(MyriadException.NotFound.class, () -> client.get(javaChunk));
        }
    }
}
