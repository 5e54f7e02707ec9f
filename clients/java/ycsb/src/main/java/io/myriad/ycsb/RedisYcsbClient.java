package io.myriad.ycsb;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import redis.clients.jedis.JedisPooled;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * The Redis binding used for the side-by-side runs of {@code scripts/ycsb}:
 * {@code -db io.myriad.ycsb.RedisYcsbClient}, over Jedis. One record = one Redis hash
 * (field name to value), as YCSB's own Redis binding stores it, but without its sorted-set
 * index (which only serves scans): read is HGETALL (or HMGET of the asked fields), insert
 * and update HSET, delete DEL; scan is answered {@code NOT_IMPLEMENTED}, as for Myriad.
 *
 * <p>Properties: {@code redis.host} (default 127.0.0.1), {@code redis.port} (6379). The
 * YCSB threads of a JVM share one connection pool.
 */
public class RedisYcsbClient extends DB {
    private static final Object LOCK = new Object();
    private static JedisPooled shared;
    private static int users;

    private JedisPooled jedis;

    @Override
    public void init() throws DBException {
        Properties properties = getProperties();
        String host = properties.getProperty("redis.host", "127.0.0.1");
        int port = Integer.parseInt(properties.getProperty("redis.port", "6379"));
        synchronized (LOCK) {
            if (shared == null) {
                org.apache.commons.pool2.impl.GenericObjectPoolConfig<redis.clients.jedis.Connection> pool =
                        new org.apache.commons.pool2.impl.GenericObjectPoolConfig<>();
                pool.setMaxTotal(256);
                pool.setMaxIdle(256);
                shared = new JedisPooled(pool, host, port);
            }
            users++;
            jedis = shared;
        }
    }

    @Override
    public void cleanup() throws DBException {
        synchronized (LOCK) {
            users--;
            if (users == 0 && shared != null) {
                shared.close();
                shared = null;
            }
        }
    }

    private static byte[] key(String table, String key) {
        return (table + ":" + key).getBytes(StandardCharsets.UTF_8);
    }

    @Override
    public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
        try {
            if (fields == null) {
                Map<byte[], byte[]> all = jedis.hgetAll(key(table, key));
                if (all.isEmpty()) {
                    return Status.NOT_FOUND;
                }
                for (Map.Entry<byte[], byte[]> field : all.entrySet()) {
                    result.put(new String(field.getKey(), StandardCharsets.UTF_8), new ByteArrayByteIterator(field.getValue()));
                }
            } else {
                byte[][] names = new byte[fields.size()][];
                int i = 0;
                for (String field : fields) {
                    names[i++] = field.getBytes(StandardCharsets.UTF_8);
                }
                java.util.List<byte[]> values = jedis.hmget(key(table, key), names);
                for (i = 0; i < names.length; i++) {
                    if (values.get(i) != null) {
                        result.put(new String(names[i], StandardCharsets.UTF_8), new ByteArrayByteIterator(values.get(i)));
                    }
                }
            }
            return Status.OK;
        } catch (RuntimeException e) {
            return Status.ERROR;
        }
    }

    @Override
    public Status scan(String table, String startkey, int recordcount, Set<String> fields,
            Vector<HashMap<String, ByteIterator>> result) {
        return MyriadYcsbClient.SCAN_NOT_SUPPORTED;
    }

    private Status write(String table, String key, Map<String, ByteIterator> values) {
        Map<byte[], byte[]> hash = new HashMap<>();
        for (Map.Entry<String, ByteIterator> value : values.entrySet()) {
            hash.put(value.getKey().getBytes(StandardCharsets.UTF_8), value.getValue().toArray());
        }
        try {
            jedis.hset(key(table, key), hash);
            return Status.OK;
        } catch (RuntimeException e) {
            return Status.ERROR;
        }
    }

    @Override
    public Status update(String table, String key, Map<String, ByteIterator> values) {
        return write(table, key, values);
    }

    @Override
    public Status insert(String table, String key, Map<String, ByteIterator> values) {
        return write(table, key, values);
    }

    @Override
    public Status delete(String table, String key) {
        try {
            return jedis.del(key(table, key)) == 1 ? Status.OK : Status.NOT_FOUND;
        } catch (RuntimeException e) {
            return Status.ERROR;
        }
    }
}
