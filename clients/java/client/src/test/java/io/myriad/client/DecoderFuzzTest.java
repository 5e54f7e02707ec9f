package io.myriad.client;

import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.myriad.client.proto.ChunkProto;
import io.myriad.client.proto.MetaProto;
import io.myriad.client.wire.Frame;
import io.myriad.client.wire.Handshake;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.function.Consumer;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Randomized tests of every decoder the client runs on bytes a server sent: random bytes,
 * and the conformance vectors mutated (flipped bits, truncated, extended, bytes replaced
 * by boundary values). Whatever the input, a decoder returns or throws
 * {@link MyriadException.Protocol}: nothing else (no index, arithmetic, allocation or
 * state errors). Seeded, so a failure repeats.
 */
class DecoderFuzzTest {
    static final List<byte[]> SEEDS = new ArrayList<>();

    static final List<Consumer<byte[]>> DECODERS = List.of(
            ChunkProto::decodeReply,
            MetaProto::decodeReply,
            MetaProto::decodeJoinReply,
            MetaProto::decodeHeartbeat,
            MetaProto::decodeEvent,
            MetaProto::decodeBarrierReleased,
            bytes -> ChunkProto.decodeMigrateReply(bytes, new String[1]),
            bytes -> Frame.decode(bytes, 0),
            bytes -> Handshake.Greeting.decode(bytes),
            bytes -> MetaProto.record(new io.myriad.client.wire.Decoder(bytes)));

    @BeforeAll
    static void seeds() throws Exception {
        ConformanceTest.load();
        SEEDS.addAll(ConformanceTest.VECTORS.values());
    }

    static void check(byte[] input) {
        for (Consumer<byte[]> decoder : DECODERS) {
            try {
                decoder.accept(input);
            } catch (MyriadException.Protocol expected) {
                // the only allowed failure
            } catch (Throwable other) {
                fail("decoder threw " + other + " on " + java.util.HexFormat.of().formatHex(input), other);
            }
        }
    }

    @Test
    void randomBytesOnlyEverRaiseProtocolErrors() {
        Random random = new Random(20);
        for (int round = 0; round < 10_000; round++) {
            byte[] input = new byte[random.nextInt(48)];
            random.nextBytes(input);
            if (input.length > 0 && random.nextBoolean()) {
                input[0] = (byte) random.nextInt(16); // a plausible tag
            }
            check(input);
        }
    }

    @Test
    void mutatedVectorsOnlyEverRaiseProtocolErrors() {
        Random random = new Random(2020);
        byte[] boundary = {0, 1, 2, (byte) 0x7f, (byte) 0x80, (byte) 0xff, (byte) 0xfe};
        int decodedSome = 0;
        for (int round = 0; round < 15_000; round++) {
            byte[] seed = SEEDS.get(random.nextInt(SEEDS.size()));
            byte[] input;
            switch (random.nextInt(4)) {
                case 0:
                    input = java.util.Arrays.copyOf(seed, random.nextInt(seed.length + 1));
                    break;
                case 1:
                    input = java.util.Arrays.copyOf(seed, seed.length + 1 + random.nextInt(4));
                    break;
                default:
                    input = seed.clone();
                    int flips = 1 + random.nextInt(3);
                    for (int i = 0; i < flips && input.length > 0; i++) {
                        int at = random.nextInt(input.length);
                        input[at] = random.nextBoolean() ? (byte) (input[at] ^ (1 << random.nextInt(8)))
                                : boundary[random.nextInt(boundary.length)];
                    }
            }
            check(input);
            try {
                ChunkProto.decodeReply(input);
                decodedSome++;
            } catch (MyriadException.Protocol ignored) {
                // expected for most
            }
        }
        assertTrue(decodedSome > 0, "some mutated inputs still decode (the fuzzer reaches deep)");
    }

    @Test
    void hostileCountsAreRefusedBeforeAllocating() {
        // A data reply claiming 2^20 items in 5 bytes, a node list claiming 65,536 records.
        check(new byte[] {2, (byte) 0x80, (byte) 0x80, 0x40});
        check(new byte[] {9, (byte) 0x80, (byte) 0x80, 0x04});
        // A chunk payload claiming 64 MiB in a 10-byte reply.
        check(new byte[] {2, 1, 0, (byte) 0x80, (byte) 0x80, (byte) 0x80, 0x20, 1, 2, 3});
    }
}
