package io.myriad.ycsb;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.myriad.client.LocalCluster;
import io.myriad.client.MyriadClient;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Vector;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import site.ycsb.ByteIterator;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * The real YCSB 0.17.0 client (a child JVM running {@code site.ycsb.Client}) loads 1,000
 * records of workload G into a real local cluster through the binding and runs 1,000
 * operations; every operation must succeed, and the records must be where the key scheme
 * says, in the record encoding.
 */
@Timeout(value = 90, unit = TimeUnit.SECONDS)
class YcsbLiveTest {
    static String runYcsb(String phase, String superpeers, String secretProperty, Path output)
            throws IOException, InterruptedException {
        List<String> command = new ArrayList<>(List.of(
                Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-cp", System.getProperty("java.class.path"),
                "site.ycsb.Client", phase, "-db", MyriadYcsbClient.class.getName(),
                "-P", "workloads/workloadg", "-threads", "4",
                "-p", "recordcount=1000", "-p", "operationcount=1000",
                "-p", "myriad.superpeers=" + superpeers, "-p", secretProperty));
        Process process = new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(output.toFile()).start();
        try {
            assertTrue(process.waitFor(60, TimeUnit.SECONDS), "YCSB " + phase + " ended in time");
        } finally {
            process.destroyForcibly();
        }
        String text = Files.readString(output, StandardCharsets.UTF_8);
        assertEquals(0, process.exitValue(), "YCSB " + phase + " exit status; output:\n" + text);
        return text;
    }

    static long metric(String output, String section, String name) {
        Matcher m = Pattern.compile("\\[" + Pattern.quote(section) + "\\], " + Pattern.quote(name) + ", (\\d+)")
                .matcher(output);
        return m.find() ? Long.parseLong(m.group(1)) : -1;
    }

    /**
     * With {@code myriad.owners=1} a table's records all go to the first peer by node ID,
     * and a bad value is refused at init.
     */
    static void recordsOnOneOwner(LocalCluster cluster) throws Exception {
        Properties properties = new Properties();
        properties.setProperty("myriad.superpeers", cluster.superpeers());
        properties.setProperty("myriad.cluster", cluster.dir().toString());
        properties.setProperty("fieldcount", "1");
        for (String bad : List.of("-1", "many")) {
            MyriadYcsbClient refused = new MyriadYcsbClient();
            Properties withBad = new Properties();
            withBad.putAll(properties);
            withBad.setProperty("myriad.owners", bad);
            refused.setProperties(withBad);
            DBException e = assertThrows(DBException.class, refused::init, bad);
            assertTrue(e.getMessage().contains("myriad.owners"), e.getMessage());
        }
        properties.setProperty("myriad.owners", "1");
        MyriadYcsbClient binding = new MyriadYcsbClient();
        binding.setProperties(properties);
        binding.init();
        try (MyriadClient client = MyriadClient.connect(cluster.config())) {
            List<Integer> peers = client.peers();
            assertEquals(2, peers.size(), "the cluster's peers");
            for (int k = 5000; k < 5006; k++) {
                Map<String, ByteIterator> row = new HashMap<>();
                row.put("field0", new site.ycsb.ByteArrayByteIterator(new byte[] {(byte) (k - 5000)}));
                assertEquals(Status.OK, binding.insert("owned", "user" + k, row));
            }
            assertEquals(String.valueOf(peers.get(0)),
                    new String(client.tmpGet("ycsb.owned.peers"), StandardCharsets.UTF_8));
            KeyScheme one = new KeyScheme(List.of(peers.get(0)));
            for (int k = 5000; k < 5006; k++) {
                assertEquals(peers.get(0).intValue(), io.myriad.client.ChunkIds.creator(one.cid("user" + k)));
                Map<String, byte[]> record = RecordCodec.decode(client.get(one.cid("user" + k)));
                assertEquals(k - 5000, record.get("field0")[0]);
            }
        } finally {
            binding.cleanup();
        }
    }

    @Test
    void loadAndRunWorkloadGThroughTheRealYcsbClient() throws Exception {
        Path out = Files.createTempFile("ycsb-", ".txt");
        try (LocalCluster cluster = LocalCluster.start(1, 2, List.of("--memory-mb", "64", "--zone-mb", "16",
                "--prefault-mb", "0", "--replication", "1"), null)) {
            // The load finds the secret through the cluster directory, the run through its file.
            String load = runYcsb("-load", cluster.superpeers(), "myriad.cluster=" + cluster.dir(), out);
            assertEquals(1000, metric(load, "INSERT", "Operations"), load);
            assertEquals(1000, metric(load, "INSERT", "Return=OK"), load);
            assertEquals(-1, metric(load, "INSERT", "Return=ERROR"), load);

            String run = runYcsb("-t", cluster.superpeers(), "myriad.secretfile=" + cluster.secretFile(), out);
            long reads = metric(run, "READ", "Return=OK");
            long updates = metric(run, "UPDATE", "Return=OK");
            assertTrue(reads > 800 && updates > 50, run);
            assertEquals(1000, reads + updates, run);
            assertEquals(-1, metric(run, "READ", "Return=ERROR"), run);
            assertEquals(-1, metric(run, "READ", "Return=NOT_FOUND"), run);
            assertEquals(-1, metric(run, "UPDATE", "Return=ERROR"), run);

            try (MyriadClient client = MyriadClient.connect(cluster.config())) {
                KeyScheme scheme = new KeyScheme(client.peers());
                for (String key : List.of("user0", "user1", "user999")) {
                    Map<String, byte[]> record = RecordCodec.decode(client.get(scheme.cid(key)));
                    assertEquals(List.of("field0"), new ArrayList<>(record.keySet()), key);
                    assertEquals(64, record.get("field0").length, key);
                    assertEquals(67, client.size(scheme.cid(key)), key);
                }
            }

            MyriadYcsbClient binding = new MyriadYcsbClient();
            Properties properties = new Properties();
            properties.setProperty("myriad.superpeers", cluster.superpeers());
            properties.setProperty("myriad.cluster", cluster.dir().toString());
            properties.setProperty("fieldcount", "1");
            binding.setProperties(properties);
            binding.init();
            try {
                Vector<HashMap<String, ByteIterator>> rows = new Vector<>();
                assertEquals(MyriadYcsbClient.SCAN_NOT_SUPPORTED, binding.scan("usertable", "user0", 10, null, rows));
                assertEquals("NOT_IMPLEMENTED", binding.scan("usertable", "user0", 10, null, rows).getName());
                assertEquals(Status.OK, binding.delete("usertable", "user5"));
                assertEquals(Status.NOT_FOUND, binding.read("usertable", "user5", null, new HashMap<>()));
                Map<String, ByteIterator> one = new HashMap<>();
                one.put("field0", new site.ycsb.ByteArrayByteIterator(new byte[] {1, 2, 3}));
                one.put("field1", new site.ycsb.ByteArrayByteIterator(new byte[] {4}));
                assertEquals(Status.OK, binding.insert("usertable", "user5", one));
                Map<String, ByteIterator> partial = new HashMap<>();
                partial.put("field1", new site.ycsb.ByteArrayByteIterator(new byte[] {9, 9, 9, 9, 9}));
                assertEquals(Status.OK, binding.update("usertable", "user5", partial));
                Map<String, ByteIterator> result = new HashMap<>();
                assertEquals(Status.OK, binding.read("usertable", "user5", null, result));
                assertEquals(3, result.get("field0").toArray().length);
                assertEquals(5, result.get("field1").toArray().length);
            } finally {
                binding.cleanup();
            }
            recordsOnOneOwner(cluster);
        } finally {
            Files.deleteIfExists(out);
        }
    }
}
