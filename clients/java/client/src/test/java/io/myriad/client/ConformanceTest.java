package io.myriad.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.myriad.client.proto.ChunkProto;
import io.myriad.client.proto.ChunkReply;
import io.myriad.client.proto.ItemError;
import io.myriad.client.proto.MetaProto;
import io.myriad.client.proto.MetaReply;
import io.myriad.client.proto.MetaResponse;
import io.myriad.client.wire.Frame;
import io.myriad.client.wire.Handshake;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The Java encoders and decoders against the Rust ones: {@code conformance/vectors.txt} is
 * written by {@code crates/proto/tests/java_vectors.rs} (which fails when it no longer
 * matches the Rust encoders). Every request vector must be produced byte for byte by the
 * Java encoder of the same case; every reply vector must decode to the case's values.
 * Every vector in the file must be checked here.
 */
class ConformanceTest {
    static final Map<String, byte[]> VECTORS = new LinkedHashMap<>();
    static final Set<String> CHECKED = new HashSet<>();
    static final long A = ChunkIds.of(1, 5);
    static final long B = ChunkIds.of(0xffff, ChunkIds.LOCAL_ID_MAX);

    @BeforeAll
    static void load() throws IOException {
        try (InputStream in = ConformanceTest.class.getResourceAsStream("/conformance/vectors.txt")) {
            String text = new String(in.readAllBytes(), StandardCharsets.UTF_8);
            for (String line : text.split("\n")) {
                if (line.isBlank() || line.startsWith("#")) {
                    continue;
                }
                String[] parts = line.split("\t");
                VECTORS.put(parts[0], hex(parts.length > 1 ? parts[1] : ""));
            }
        }
        assertTrue(VECTORS.size() > 80, "vectors loaded");
    }

    static byte[] hex(String text) {
        byte[] out = new byte[text.length() / 2];
        for (int i = 0; i < out.length; i++) {
            out[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
        }
        return out;
    }

    static byte[] vector(String name) {
        byte[] bytes = VECTORS.get(name);
        assertTrue(bytes != null, "vector " + name + " exists");
        CHECKED.add(name);
        return bytes;
    }

    static void same(String name, byte[] javaBytes) {
        assertArrayEquals(vector(name), javaBytes, name);
    }

    static byte[] pattern(int length) {
        byte[] out = new byte[length];
        for (int i = 0; i < length; i++) {
            out[i] = (byte) (i % 251);
        }
        return out;
    }

    static byte[] utf8(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    @Test
    void wireHeadersGreetingsAndProofs() {
        same("frame.request", new Frame(Frame.KIND_REQUEST, true, Frame.LAST, 0x11, 0x22, 0x04030201, 256).encode());
        same("frame.response", new Frame(Frame.KIND_RESPONSE, false, Frame.WHOLE, 20, 0, 7, 10).encode());
        assertEquals(new Frame(Frame.KIND_REQUEST, true, Frame.LAST, 0x11, 0x22, 0x04030201, 256),
                Frame.decode(vector("frame.request"), 0));
        byte[] nonceC = new byte[16];
        Arrays.fill(nonceC, (byte) 0xab);
        byte[] nonceA = new byte[16];
        Arrays.fill(nonceA, (byte) 7);
        byte[] connector = new Handshake.Greeting(0x0102, 0x1122334455667788L, nonceC, false).encode();
        byte[] acceptor = new Handshake.Greeting(1, 42, nonceA, false).encode();
        same("greeting.connector", connector);
        same("greeting.acceptor", acceptor);
        Handshake.Greeting parsed = Handshake.Greeting.decode(connector);
        assertEquals(0x0102, parsed.node);
        assertEquals(0x1122334455667788L, parsed.instance);
        byte[] secret = utf8("myriad");
        same("proof.acceptor", Handshake.acceptorProof(secret, connector, acceptor));
        same("proof.connector", Handshake.connectorProof(secret, connector, acceptor));
    }

    @Test
    void chunkRequestsAreByteForByteTheRustOnes() {
        same("chunk.create", ChunkProto.create(1, new long[] {64, 0, 300}));
        same("chunk.create_with_data", ChunkProto.createWithData(2, List.of(utf8("abc"), new byte[0], pattern(200))));
        same("chunk.get", ChunkProto.get(new long[] {A, B}));
        same("chunk.put", ChunkProto.put(3, new long[] {A, B}, new byte[][] {utf8("xyz"), pattern(130)}));
        same("chunk.remove", ChunkProto.remove(0, new long[] {A, B}));
        same("chunk.insert", ChunkProto.insert(1, new long[] {A}, new byte[][] {utf8("q")}));
        same("chunk.read_at", ChunkProto.readAt(A, 300, 5));
        same("chunk.write_at", ChunkProto.writeAt(2, A, 128, utf8("hello")));
        same("chunk.resize", ChunkProto.resize(0, B, 70_000));
        same("chunk.lock", ChunkProto.lock(A, true, 1500));
        same("chunk.unlock", ChunkProto.unlock(A, false));
        same("chunk.status", ChunkProto.status(new long[] {B}));
        same("chunk.list", ChunkProto.list(2, 1000));
        same("chunk.list_all", ChunkProto.list(-1, 5));
        same("chunk.stats", ChunkProto.stats());
        same("migrate.request", ChunkProto.migrate(ChunkIds.of(2, 5), ChunkIds.of(2, 300), 3));
        String[] reason = new String[1];
        assertEquals(296, ChunkProto.decodeMigrateReply(vector("migrate.reply.moved"), reason));
        assertEquals(-1, ChunkProto.decodeMigrateReply(vector("migrate.reply.failed"), reason));
        assertEquals("not the owner", reason[0]);
    }

    @Test
    void chunkRepliesDecodeToTheRustValues() {
        ChunkReply created = ChunkProto.decodeReply(vector("chunk.reply.created"));
        assertArrayEquals(new long[] {A, ChunkIds.of(2, 1L << 40)}, created.cids);

        ChunkReply data = ChunkProto.decodeReply(vector("chunk.reply.data"));
        assertEquals(ChunkReply.DATA, data.tag);
        assertArrayEquals(utf8("abc"), data.data[0]);
        assertEquals(new ItemError(ItemError.NOT_FOUND, null), data.errors[1]);
        assertEquals(new ItemError(ItemError.NOT_OWNER, null), data.errors[2]);
        assertArrayEquals(pattern(150), data.data[3]);
        assertEquals(new ItemError(ItemError.INVALID, "bad offset"), data.errors[4]);
        assertEquals(new ItemError(ItemError.INTERNAL, "ünïcode"), data.errors[5]);
        assertNull(data.errors[0]);

        ChunkReply statuses = ChunkProto.decodeReply(vector("chunk.reply.statuses"));
        assertNull(statuses.errors[0]);
        assertEquals(ItemError.TOO_LARGE, statuses.errors[1].code);
        assertEquals(ItemError.OUT_OF_MEMORY, statuses.errors[2].code);
        assertEquals(ItemError.LOCK_TIMEOUT, statuses.errors[3].code);

        ChunkReply sizes = ChunkProto.decodeReply(vector("chunk.reply.sizes"));
        assertEquals(64, sizes.sizes[0]);
        assertEquals(ItemError.NOT_FOUND, sizes.errors[1].code);
        assertEquals(1 << 20, sizes.sizes[2]);

        ChunkReply ranges = ChunkProto.decodeReply(vector("chunk.reply.ranges"));
        assertTrue(ranges.truncated);
        assertArrayEquals(new long[] {ChunkIds.of(1, 0), ChunkIds.of(1, 9), ChunkIds.of(3, 7), ChunkIds.of(3, 7)},
                ranges.ranges);

        assertArrayEquals(new long[] {1, 200, 300, 400, 70_000, 6, 1_000_000}, ChunkProto.decodeReply(vector("chunk.reply.stats")).stats);
        assertEquals(ItemError.OUT_OF_MEMORY, ChunkProto.decodeReply(vector("chunk.reply.failed")).failed.code);
        assertEquals("truncated", ChunkProto.decodeReply(vector("chunk.reply.malformed")).malformed);
    }

    @Test
    void metaRequestsAreByteForByteTheRustOnes() {
        same("meta.leave", MetaProto.write(MetaProto.commandLeave(300)));
        same("meta.name_register", MetaProto.write(MetaProto.commandNameRegister("name-ü", A)));
        same("meta.name_remove", MetaProto.write(MetaProto.commandNameRemove("n")));
        same("meta.barrier_alloc", MetaProto.write(MetaProto.commandBarrierAlloc(200)));
        same("meta.barrier_sign_on", MetaProto.write(MetaProto.commandBarrierSignOn(3, 0x1234, -2L)));
        same("meta.barrier_resize", MetaProto.write(MetaProto.commandBarrierResize(3, 5)));
        same("meta.barrier_free", MetaProto.write(MetaProto.commandBarrierFree(129)));
        same("meta.tmp_put", MetaProto.write(MetaProto.commandTmpPut("blob", new byte[] {1, 2, 3}, true)));
        same("meta.tmp_remove", MetaProto.write(MetaProto.commandTmpRemove("blob")));
        same("meta.lookup", MetaProto.lookup(ChunkIds.of(2, 77)));
        same("meta.lookup_tree", MetaProto.lookupTree(2));
        same("meta.name_get", MetaProto.nameGet("name"));
        same("meta.name_list", MetaProto.nameList());
        same("meta.tmp_get", MetaProto.tmpGet("blob"));
        same("meta.tmp_list", MetaProto.tmpList());
        same("meta.barrier_status", MetaProto.barrierStatus(300));
        same("meta.nodes", MetaProto.nodes());
        same("meta.zones", MetaProto.zones(2));
        same("meta.status", MetaProto.status());
        same("join.request", MetaProto.joinRequest(3, "127.0.0.1:4000", 7, 1, 2, -1));
        same("join.request_reclaim", MetaProto.joinRequest(2, "h:1", 3, 0, 0, 9));
        same("heartbeat.reply", MetaProto.heartbeatReply(300, 5));
    }

    static MetaReply meta(String name) {
        return MetaProto.decodeReply(vector(name));
    }

    static void checkNodes(List<NodeInfo> nodes) {
        assertEquals(List.of(
                new NodeInfo(1, NodeInfo.SUPERPEER, "127.0.0.1:4000", 7, 3, 4, NodeInfo.ALIVE, 0, 2, 300, false),
                new NodeInfo(2, NodeInfo.PEER, "127.0.0.1:4001", 7, 3, 4, NodeInfo.FAILED, 9, 2, 300, false),
                new NodeInfo(0x300, NodeInfo.CLIENT, "10.0.0.1:5", 7, 3, 4, NodeInfo.LEFT, 0, 2, 300, false)), nodes);
    }

    @Test
    void metaRepliesDecodeToTheRustValues() {
        assertEquals(MetaResponse.DONE, meta("meta.reply.done").response.tag);
        assertArrayEquals(new long[] {7}, meta("meta.reply.barrier_allocated").response.values);
        MetaResponse released = meta("meta.reply.barrier_released").response;
        assertArrayEquals(new long[] {4, 2, 2}, released.values);
        assertEquals(Map.of(5, 11L, 300, -1L), released.released);
        assertNull(meta("meta.reply.barrier_waiting").response.released);
        assertEquals(new MetaError(MetaError.Kind.TMP_EXISTS, -1, -1, "blob"), meta("meta.reply.error").response.error);
        assertEquals(new MetaError(MetaError.Kind.ZONE_NOT_FOUND, 2, 300, null), meta("meta.reply.error_zone").response.error);
        assertArrayEquals(new long[] {2, 0, 1L << 40, 3}, meta("meta.reply.lookup").lookup);
        assertArrayEquals(new long[] {0, 9, 5, 20, 300, 6}, meta("meta.reply.lookup_tree").ranges);
        MetaReply name = meta("meta.reply.name");
        assertTrue(name.present);
        assertEquals(A, name.cid);
        assertFalse(meta("meta.reply.name_none").present);
        assertEquals(Map.of("a", ChunkIds.of(1, 1), "b", ChunkIds.of(2, 2)), meta("meta.reply.names").names);
        assertArrayEquals(new byte[] {9, 8, 7}, meta("meta.reply.tmp").blob);
        assertFalse(meta("meta.reply.tmp_none").present);
        assertEquals(Map.of("blob", 3L, "big", 1L << 20), meta("meta.reply.tmp_list").sizes);
        assertEquals(new BarrierStatus(3, 2, 1, Map.of(5, 1L, 6, 2L)), meta("meta.reply.barrier").barrier);
        checkNodes(meta("meta.reply.nodes").nodes);
        MetaReply zones = meta("meta.reply.zones");
        assertEquals(Map.of(0L, List.of(3, 4), 300L, List.of()), zones.zones);
        MetaReply status = meta("meta.reply.status");
        assertArrayEquals(new long[] {1, 12, 2, 3, 500, -1}, status.status);
        assertEquals(Map.of(1, "127.0.0.1:4000"), status.members);
        assertEquals(2, meta("meta.reply.not_leader").leader);
        assertEquals("no quorum: x", meta("meta.reply.unavailable").reason);
        assertArrayEquals(new long[] {1, 2, 3, 4}, meta("meta.reply.bases").bases);
    }

    @Test
    void joinsHeartbeatsEventsAndReleasesDecodeToTheRustValues() {
        MetaProto.JoinReply ok = MetaProto.decodeJoinReply(vector("join.reply.ok"));
        assertEquals(1, ok.tag);
        assertEquals(0x0102, ok.id);
        assertEquals(3, ok.incarnation);
        assertEquals(200, ok.epoch);
        assertEquals(800, ok.leaseMs);
        checkNodes(ok.nodes);
        MetaProto.JoinReply notLeader = MetaProto.decodeJoinReply(vector("join.reply.not_leader"));
        assertEquals(2, notLeader.tag);
        assertEquals(-1, notLeader.leader);
        assertEquals(MetaError.Kind.NODE_IDS_EXHAUSTED, MetaProto.decodeJoinReply(vector("join.reply.refused")).refused.kind);
        assertEquals("stopped: bye", MetaProto.decodeJoinReply(vector("join.reply.unavailable")).reason);
        assertArrayEquals(new long[] {7, 300, 800}, MetaProto.decodeHeartbeat(vector("heartbeat")));

        MetaProto.Event joined = MetaProto.decodeEvent(vector("event.joined"));
        assertEquals(5, joined.epoch);
        assertEquals(new NodeInfo(7, NodeInfo.PEER, "127.0.0.1:9", 7, 3, 4, NodeInfo.ALIVE, 0, 2, 300, false), joined.record);
        MetaProto.Event failed = MetaProto.decodeEvent(vector("event.failed"));
        assertEquals(2, failed.tag);
        assertEquals(7, failed.node);
        MetaProto.Event left = MetaProto.decodeEvent(vector("event.left"));
        assertEquals(3, left.tag);
        assertEquals(300, left.epoch);
        MetaProto.Event moved = MetaProto.decodeEvent(vector("event.owner_changed"));
        assertEquals(4, moved.tag);
        assertEquals(List.of(2L, 10L, 20L, 3L), List.of((long) moved.node, moved.first, moved.last, (long) moved.owner));
        MetaProto.BarrierReleased release = MetaProto.decodeBarrierReleased(vector("barrier.released"));
        assertEquals(3, release.id);
        assertEquals(9, release.round);
        assertEquals(Map.of(5, 1L, 6, 2L), release.values);
    }

    @Test
    void zzEveryVectorIsChecked() {
        // Runs after the others in JUnit's default (deterministic, name-based) method order
        // only by convention; so it checks the names independently of order instead.
        Set<String> expected = new HashSet<>(VECTORS.keySet());
        new ConformanceTest().wireHeadersGreetingsAndProofs();
        new ConformanceTest().chunkRequestsAreByteForByteTheRustOnes();
        new ConformanceTest().chunkRepliesDecodeToTheRustValues();
        new ConformanceTest().metaRequestsAreByteForByteTheRustOnes();
        new ConformanceTest().metaRepliesDecodeToTheRustValues();
        new ConformanceTest().joinsHeartbeatsEventsAndReleasesDecodeToTheRustValues();
        expected.removeAll(CHECKED);
        assertEquals(Set.of(), expected, "vectors no Java test checks");
    }
}
