package io.myriad.client.wire;

import io.myriad.client.MyriadException;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * The connection handshake of {@code docs/wire-format.md} section 1: 32-byte greetings
 * ("MYRN", version 1, flags, node ID, instance ID, nonce), HMAC-SHA256 proofs over both
 * greetings with the labels {@code "myriad-net/1 acceptor"} / {@code "myriad-net/1 connector"},
 * and the one-byte verdict.
 */
public final class Handshake {
    /** Bytes of a greeting. */
    public static final int GREETING_BYTES = 32;
    /** Bytes of a proof. */
    public static final int PROOF_BYTES = 32;
    /** Bytes of a nonce. */
    public static final int NONCE_BYTES = 16;
    /** Protocol version spoken. */
    public static final int VERSION = 1;
    /** Greeting flag: a direct request lane (this client never opens lanes). */
    public static final int FLAG_LANE = 1;
    /** Longest secret accepted. */
    public static final int SECRET_BYTES_MAX = 1024;

    /** Verdict byte: the connection is accepted. */
    public static final int ACCEPTED = 1;
    /** Verdict byte: another connection between the two nodes wins. */
    public static final int DUPLICATE = 2;
    /** Verdict byte: the connector is refused (fenced). */
    public static final int REFUSED = 3;

    private static final byte[] MAGIC = {'M', 'Y', 'R', 'N'};
    private static final byte[] ACCEPTOR_LABEL = "myriad-net/1 acceptor".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] CONNECTOR_LABEL = "myriad-net/1 connector".getBytes(StandardCharsets.US_ASCII);

    private Handshake() {}

    /** A parsed greeting. */
    public static final class Greeting {
        /** The sender's node ID. */
        public final int node;
        /** The sender's endpoint instance. */
        public final long instance;
        /** Its nonce (16 bytes). */
        public final byte[] nonce;
        /** The lane flag. */
        public final boolean lane;

        /** A greeting with these fields. */
        public Greeting(int node, long instance, byte[] nonce, boolean lane) {
            this.node = node;
            this.instance = instance;
            this.nonce = nonce.clone();
            this.lane = lane;
        }

        /** The 32 bytes. */
        public byte[] encode() {
            byte[] out = new byte[GREETING_BYTES];
            System.arraycopy(MAGIC, 0, out, 0, 4);
            out[4] = (byte) VERSION;
            out[5] = (byte) (lane ? FLAG_LANE : 0);
            out[6] = (byte) node;
            out[7] = (byte) (node >>> 8);
            for (int i = 0; i < 8; i++) {
                out[8 + i] = (byte) (instance >>> (8 * i));
            }
            System.arraycopy(nonce, 0, out, 16, NONCE_BYTES);
            return out;
        }

        /** Parses 32 bytes; {@link MyriadException.Protocol} on a bad magic, version or flag. */
        public static Greeting decode(byte[] in) {
            if (in.length != GREETING_BYTES) {
                throw new MyriadException.Protocol("greeting of " + in.length + " bytes");
            }
            for (int i = 0; i < 4; i++) {
                if (in[i] != MAGIC[i]) {
                    throw new MyriadException.Protocol("bad handshake magic");
                }
            }
            if ((in[4] & 0xff) != VERSION) {
                throw new MyriadException.Protocol("bad protocol version " + (in[4] & 0xff));
            }
            int flags = in[5] & 0xff;
            if ((flags & ~FLAG_LANE) != 0) {
                throw new MyriadException.Protocol("reserved greeting flag set");
            }
            int node = (in[6] & 0xff) | ((in[7] & 0xff) << 8);
            long instance = 0;
            for (int i = 0; i < 8; i++) {
                instance |= (long) (in[8 + i] & 0xff) << (8 * i);
            }
            byte[] nonce = new byte[NONCE_BYTES];
            System.arraycopy(in, 16, nonce, 0, NONCE_BYTES);
            return new Greeting(node, instance, nonce, (flags & FLAG_LANE) != 0);
        }
    }

    private static byte[] proof(byte[] secret, byte[] label, byte[] connector, byte[] acceptor) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            // An empty key is not allowed by SecretKeySpec; the Rust side refuses it at start-up.
            mac.init(new SecretKeySpec(secret.length == 0 ? new byte[1] : secret, "HmacSHA256"));
            mac.update(label);
            mac.update(connector);
            mac.update(acceptor);
            return mac.doFinal();
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 is part of every Java 17 runtime", e);
        }
    }

    /** The acceptor's proof over both greetings. */
    public static byte[] acceptorProof(byte[] secret, byte[] connector, byte[] acceptor) {
        return proof(secret, ACCEPTOR_LABEL, connector, acceptor);
    }

    /** The connector's proof over both greetings. */
    public static byte[] connectorProof(byte[] secret, byte[] connector, byte[] acceptor) {
        return proof(secret, CONNECTOR_LABEL, connector, acceptor);
    }

    /** Whether two proofs are equal, in constant time. */
    public static boolean proofsEqual(byte[] expected, byte[] received) {
        return MessageDigest.isEqual(expected, received);
    }
}
