package io.myriad.ycsb;

import io.myriad.client.ClientConfig;
import io.myriad.client.Durability;
import io.myriad.client.MetaError;
import io.myriad.client.MyriadClient;
import io.myriad.client.MyriadException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import java.util.concurrent.atomic.AtomicInteger;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * The YCSB binding of Myriad: {@code -db io.myriad.ycsb.MyriadYcsbClient}.
 *
 * <p>One record is one chunk holding its fields in {@link RecordCodec}'s compact encoding;
 * keys map to CIDs by {@link KeyScheme} (no lookup per key); insert creates the chunk
 * under its CID, read is one get, update one put when it writes every field (otherwise a
 * get, a merge and a put: not atomic against a concurrent update of the same record), delete
 * one remove. Scan is answered {@code NOT_IMPLEMENTED}: Myriad keeps no ordered key index.
 *
 * <p>Properties: {@code myriad.superpeers} (required, {@code "1=127.0.0.1:P,..."}); the
 * cluster secret from {@code myriad.secretfile} (a file of mode 0600, first line), else
 * {@code myriad.cluster} (a directory of {@code myriad cluster start}: its
 * {@code cluster.json}'s {@code secret_file}, else {@code DIR/secret}), else the file named
 * by the environment variable {@code MYRIAD_SECRET_FILE}; there is no default secret and
 * none is taken from a property (YCSB properties end up on command lines).
 * TLS: {@code myriad.tls.dir} (a directory of {@code myriad cert}) with the certificate
 * {@code myriad.tls.name} (default {@code client}), else the TLS directory of
 * {@code myriad.cluster} (a cluster started with {@code --tls}), else none.
 * {@code myriad.durability} (default|async|replicated|durable; default: the cluster's),
 * {@code myriad.timeout_ms} (per call, default 2000), {@code myriad.lanes} (true|false,
 * default false: with YCSB's many threads per JVM the shared connections measured better
 * than one lane per thread and peer, see docs/benchmarks.md).
 * {@code myriad.owners} (how many peers own the records, the first ones by node ID; default
 * 0: all alive peers): read when a table's peer list is first fixed (the load phase), later
 * phases use the stored list. All YCSB threads of a JVM share one
 * {@link MyriadClient}.
 */
public class MyriadYcsbClient extends DB {
    /** The scan answer. */
    public static final Status SCAN_NOT_SUPPORTED = new Status("NOT_IMPLEMENTED",
            "Myriad keeps no ordered key index: scan (workload E) is not supported");

    private static final Object LOCK = new Object();
    private static MyriadClient shared;
    private static int users;
    private static final Map<String, KeyScheme> SCHEMES = new HashMap<>();
    private static final AtomicInteger ERRORS_LOGGED = new AtomicInteger();
    private static final AtomicInteger SCANS_LOGGED = new AtomicInteger();

    private MyriadClient client;
    private String schemeTable;
    private KeyScheme scheme;
    private Durability durability;
    private int fieldCount;
    private int owners;

    @Override
    public void init() throws DBException {
        Properties properties = getProperties();
        String superpeers = properties.getProperty("myriad.superpeers");
        if (superpeers == null || superpeers.isBlank()) {
            throw new DBException("set myriad.superpeers (\"1=127.0.0.1:PORT,...\")");
        }
        durability = Durability.parse(properties.getProperty("myriad.durability", "default"));
        fieldCount = Integer.parseInt(properties.getProperty("fieldcount", "10"));
        try {
            owners = Integer.parseInt(properties.getProperty("myriad.owners", "0"));
        } catch (NumberFormatException e) {
            throw new DBException("myriad.owners must be a number of peers (0: all)");
        }
        if (owners < 0) {
            throw new DBException("myriad.owners must be a number of peers (0: all)");
        }
        synchronized (LOCK) {
            if (shared == null) {
                ClientConfig config = ClientConfig.of(superpeers);
                try {
                    config.secret = secret(properties);
                    tls(properties, config);
                } catch (MyriadException e) {
                    throw new DBException(e.getMessage(), e);
                }
                config.chunkTimeout = Duration.ofMillis(Long.parseLong(properties.getProperty("myriad.timeout_ms", "2000")));
                config.durability = durability;
                config.lanes = Boolean.parseBoolean(properties.getProperty("myriad.lanes", "false"));
                try {
                    shared = MyriadClient.connect(config);
                } catch (MyriadException e) {
                    throw new DBException("cannot join the Myriad cluster: " + e.getMessage(), e);
                }
            }
            users++;
            client = shared;
        }
    }

    /**
     * The cluster secret the properties name ({@code myriad.secretfile}, else
     * {@code myriad.cluster}'s file); {@code null}: none named, so {@code connect} takes
     * {@code MYRIAD_SECRET_FILE}'s or refuses.
     */
    static byte[] secret(Properties properties) throws DBException {
        if (properties.getProperty("myriad.secret") != null) {
            throw new DBException("myriad.secret is not supported (a secret must not be on a command line): "
                    + "set myriad.secretfile=FILE or myriad.cluster=DIR");
        }
        String file = properties.getProperty("myriad.secretfile");
        if (file != null && !file.isBlank()) {
            return ClientConfig.readSecretFile(Path.of(file));
        }
        String cluster = properties.getProperty("myriad.cluster");
        if (cluster != null && !cluster.isBlank()) {
            return ClientConfig.readSecretFile(ClientConfig.clusterSecretFile(Path.of(cluster)));
        }
        return null;
    }

    /**
     * Sets {@code config}'s TLS from the properties: {@code myriad.tls.dir} with
     * {@code myriad.tls.name} (default {@code client}), else {@code myriad.cluster}'s TLS
     * directory (a cluster started with {@code --tls}); neither: no TLS.
     */
    static void tls(Properties properties, ClientConfig config) throws DBException {
        String name = properties.getProperty("myriad.tls.name", ClientConfig.TLS_NAME_DEFAULT);
        String dir = properties.getProperty("myriad.tls.dir");
        if (dir != null && !dir.isBlank()) {
            config.withTlsDir(Path.of(dir), name);
            return;
        }
        String cluster = properties.getProperty("myriad.cluster");
        Path clusterTls = cluster == null || cluster.isBlank() ? null : ClientConfig.clusterTlsDir(Path.of(cluster));
        if (clusterTls != null) {
            config.withTlsDir(clusterTls, name);
        } else if (properties.getProperty("myriad.tls.name") != null) {
            throw new DBException("myriad.tls.name needs myriad.tls.dir (or a myriad.cluster started with --tls)");
        }
    }

    @Override
    public void cleanup() throws DBException {
        synchronized (LOCK) {
            users--;
            if (users == 0 && shared != null) {
                shared.close();
                shared = null;
                SCHEMES.clear();
            }
        }
    }

    /** The key scheme of a table: its peer list, fixed by the first user (load) in tmp storage. */
    private KeyScheme scheme(String table) {
        if (table.equals(schemeTable)) {
            return scheme;
        }
        KeyScheme found = sharedScheme(table);
        schemeTable = table;
        scheme = found;
        return found;
    }

    private KeyScheme sharedScheme(String table) {
        synchronized (LOCK) {
            KeyScheme scheme = SCHEMES.get(table);
            if (scheme != null) {
                return scheme;
            }
            String name = "ycsb." + table + ".peers";
            byte[] stored = client.tmpGet(name);
            if (stored == null) {
                StringBuilder list = new StringBuilder();
                List<Integer> all = client.peers();
                int count = owners == 0 ? all.size() : Math.min(owners, all.size());
                for (int peer : all.subList(0, count)) {
                    list.append(list.length() == 0 ? "" : ",").append(peer);
                }
                try {
                    client.tmpCreate(name, list.toString().getBytes(StandardCharsets.UTF_8));
                } catch (MyriadException.Meta e) {
                    if (e.error.kind != MetaError.Kind.TMP_EXISTS) {
                        throw e;
                    }
                }
                stored = client.tmpGet(name);
            }
            List<Integer> peers = new ArrayList<>();
            for (String id : new String(stored, StandardCharsets.UTF_8).split(",")) {
                peers.add(Integer.parseInt(id.trim()));
            }
            scheme = new KeyScheme(peers);
            SCHEMES.put(table, scheme);
            return scheme;
        }
    }

    private static Status error(String op, String key, RuntimeException e) {
        if (ERRORS_LOGGED.incrementAndGet() <= 10) {
            System.err.println("myriad: " + op + " " + key + " failed: " + e.getMessage());
        }
        return Status.ERROR;
    }

    private static Map<String, byte[]> bytes(Map<String, ByteIterator> values) {
        Map<String, byte[]> out = new LinkedHashMap<>();
        for (Map.Entry<String, ByteIterator> value : values.entrySet()) {
            out.put(value.getKey(), value.getValue().toArray());
        }
        return out;
    }

    @Override
    public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
        try {
            Map<String, byte[]> record = RecordCodec.decode(client.get(scheme(table).cid(key)));
            for (Map.Entry<String, byte[]> field : record.entrySet()) {
                if (fields == null || fields.contains(field.getKey())) {
                    result.put(field.getKey(), new ByteArrayByteIterator(field.getValue()));
                }
            }
            return Status.OK;
        } catch (MyriadException.NotFound e) {
            return Status.NOT_FOUND;
        } catch (RuntimeException e) {
            return error("read", key, e);
        }
    }

    @Override
    public Status scan(String table, String startkey, int recordcount, Set<String> fields,
            Vector<HashMap<String, ByteIterator>> result) {
        if (SCANS_LOGGED.incrementAndGet() == 1) {
            System.err.println("myriad: " + SCAN_NOT_SUPPORTED.getDescription());
        }
        return SCAN_NOT_SUPPORTED;
    }

    @Override
    public Status update(String table, String key, Map<String, ByteIterator> values) {
        try {
            long cid = scheme(table).cid(key);
            Map<String, byte[]> update = bytes(values);
            if (update.size() >= fieldCount) {
                try {
                    client.put(cid, RecordCodec.encode(update), durability);
                    return Status.OK;
                } catch (MyriadException.InvalidArgument sizeChanged) {
                    // the stored record has other fields or sizes: merge below
                }
            }
            byte[] stored = client.get(cid);
            Map<String, byte[]> record = RecordCodec.decode(stored);
            record.putAll(update);
            byte[] encoded = RecordCodec.encode(record);
            if (stored.length != encoded.length) {
                client.resize(cid, encoded.length, durability);
            }
            client.put(cid, encoded, durability);
            return Status.OK;
        } catch (MyriadException.NotFound e) {
            return Status.NOT_FOUND;
        } catch (RuntimeException e) {
            return error("update", key, e);
        }
    }

    @Override
    public Status insert(String table, String key, Map<String, ByteIterator> values) {
        try {
            client.insert(scheme(table).cid(key), RecordCodec.encode(bytes(values)), durability);
            return Status.OK;
        } catch (RuntimeException e) {
            return error("insert", key, e);
        }
    }

    @Override
    public Status delete(String table, String key) {
        try {
            client.remove(scheme(table).cid(key), durability);
            return Status.OK;
        } catch (MyriadException.NotFound e) {
            return Status.NOT_FOUND;
        } catch (RuntimeException e) {
            return error("delete", key, e);
        }
    }
}
