package io.myriad.client.net;

import io.myriad.client.MyriadException;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.SecureRandom;
import java.security.Signature;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.security.spec.InvalidKeySpecException;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SNIHostName;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManagerFactory;

/**
 * TLS for this client's connections, as the nodes do it ({@code crates/net/src/tls.rs},
 * {@code docs/security.md}): TLS 1.3 with mutual authentication by the cluster CA, from the
 * PEM files {@code myriad cert} writes, read with the JDK alone (no Bouncy Castle, no
 * conversion): the CA certificate ({@code ca.pem}), this client's certificate
 * ({@code NAME.pem}) and its PKCS#8 private key ({@code NAME.key}, {@code BEGIN PRIVATE
 * KEY}: ECDSA P-256 as rcgen writes them; RSA and Ed25519 PKCS#8 keys load too).
 *
 * <p>Invariants: as connector, the node's certificate must be signed by the cluster CA and
 * name {@value #NODE_NAME} (every certificate of the cluster does, whatever its role or
 * address); as acceptor (a superpeer dials this client for heartbeats and events), a
 * certificate signed by the CA is required from the connector. The HMAC handshake of
 * {@code docs/wire-format.md} then runs inside TLS unchanged: a certificate alone does not
 * let a node in, nor the secret alone. Immutable and thread-safe; built once per client.
 *
 * <p>Called by {@link Endpoint} (dial and accept) and {@code ClientConfig.withTlsDir}.
 */
public final class Tls {
    /** The DNS name every certificate of a cluster carries; the name a connector verifies. */
    public static final String NODE_NAME = "node.myriad";
    /** The CA certificate's file name in a TLS directory. */
    public static final String CA_CERT_FILE = "ca.pem";
    /** The only protocol offered and accepted. */
    public static final String PROTOCOL = "TLSv1.3";

    private static final Pattern PEM_BLOCK = Pattern.compile(
            "-----BEGIN ([A-Z0-9 ]+)-----([A-Za-z0-9+/=\\s]*)-----END \\1-----");
    private static final char[] NO_PASSWORD = new char[0];

    private final SSLContext context;

    private Tls(SSLContext context) {
        this.context = context;
    }

    /**
     * Loads {@code DIR/ca.pem}, {@code DIR/NAME.pem} and {@code DIR/NAME.key}: the layout of
     * {@code myriad cert issue DIR NAME} and of {@code myriad cluster start --tls}
     * ({@code DIR/tls}, certificate {@code client}).
     *
     * @throws MyriadException.InvalidArgument a file is missing or does not load
     */
    public static Tls fromDir(Path dir, String name) {
        return fromPemFiles(dir.resolve(CA_CERT_FILE), dir.resolve(name + ".pem"), dir.resolve(name + ".key"));
    }

    /**
     * Loads the CA certificate(s) {@code ca}, this client's certificate chain {@code cert}
     * (its own certificate first) and its private key {@code key}, all PEM.
     *
     * @throws MyriadException.InvalidArgument a file is missing or does not load, or the key
     *     does not belong to the certificate
     */
    public static Tls fromPemFiles(Path ca, Path cert, Path key) {
        List<X509Certificate> authorities = readCertificates(ca);
        List<X509Certificate> chain = readCertificates(cert);
        PrivateKey privateKey = readPrivateKey(key);
        if (!belongsTo(privateKey, chain.get(0))) {
            throw new MyriadException.InvalidArgument("TLS: the key " + key + " does not belong to the certificate "
                    + cert);
        }
        try {
            KeyStore trusted = KeyStore.getInstance("PKCS12");
            trusted.load(null, null);
            for (int i = 0; i < authorities.size(); i++) {
                trusted.setCertificateEntry("ca-" + i, authorities.get(i));
            }
            TrustManagerFactory trust = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            trust.init(trusted);
            KeyStore own = KeyStore.getInstance("PKCS12");
            own.load(null, null);
            own.setKeyEntry("client", privateKey, NO_PASSWORD, chain.toArray(new Certificate[0]));
            KeyManagerFactory keys = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
            keys.init(own, NO_PASSWORD);
            SSLContext context = SSLContext.getInstance(PROTOCOL);
            context.init(keys.getKeyManagers(), trust.getTrustManagers(), new SecureRandom());
            return new Tls(context);
        } catch (GeneralSecurityException | IOException e) {
            throw new MyriadException.InvalidArgument("TLS configuration: " + e.getMessage());
        }
    }

    /** Whether {@code key} is the private key of {@code certificate}: a signature made with it verifies. */
    private static boolean belongsTo(PrivateKey key, X509Certificate certificate) {
        String algorithm = switch (key.getAlgorithm()) {
            case "EC" -> "SHA256withECDSA";
            case "RSA" -> "SHA256withRSA";
            default -> key.getAlgorithm(); // Ed25519, EdDSA
        };
        try {
            byte[] probe = "myriad key check".getBytes(StandardCharsets.US_ASCII);
            Signature signer = Signature.getInstance(algorithm);
            signer.initSign(key);
            signer.update(probe);
            byte[] signature = signer.sign();
            Signature verifier = Signature.getInstance(algorithm);
            verifier.initVerify(certificate.getPublicKey());
            verifier.update(probe);
            return verifier.verify(signature);
        } catch (GeneralSecurityException e) {
            return false;
        }
    }

    /**
     * The connector's TLS handshake on {@code socket} (connected to {@code address}), each
     * step waiting at most {@code timeoutMs}; returns the TLS socket over it (closing it
     * closes {@code socket}). Throws an {@link IOException} (an
     * {@link javax.net.ssl.SSLHandshakeException} for a certificate that does not verify)
     * if the handshake fails.
     */
    SSLSocket connect(Socket socket, InetSocketAddress address, int timeoutMs) throws IOException {
        SSLSocket tls = (SSLSocket) context.getSocketFactory().createSocket(socket, NODE_NAME, address.getPort(), true);
        SSLParameters parameters = tls.getSSLParameters();
        parameters.setProtocols(new String[] {PROTOCOL});
        parameters.setServerNames(List.of(new SNIHostName(NODE_NAME)));
        // Checks that the node's certificate names NODE_NAME (as DNS subject alternative name).
        parameters.setEndpointIdentificationAlgorithm("HTTPS");
        tls.setSSLParameters(parameters);
        tls.setUseClientMode(true);
        tls.setSoTimeout(timeoutMs);
        tls.startHandshake();
        return tls;
    }

    /**
     * The acceptor's TLS handshake on an accepted {@code socket}: requires a certificate of
     * the cluster CA from the connector. Returns the TLS socket (closing it closes
     * {@code socket}); throws an {@link IOException} if the handshake fails.
     */
    SSLSocket accept(Socket socket, int timeoutMs) throws IOException {
        SSLSocket tls = (SSLSocket) context.getSocketFactory().createSocket(socket, null, true);
        SSLParameters parameters = tls.getSSLParameters();
        parameters.setProtocols(new String[] {PROTOCOL});
        parameters.setNeedClientAuth(true);
        tls.setSSLParameters(parameters);
        tls.setUseClientMode(false);
        tls.setSoTimeout(timeoutMs);
        tls.startHandshake();
        return tls;
    }

    /** The PEM blocks of {@code file} labelled {@code label}, decoded. */
    private static List<byte[]> pemBlocks(Path file, String label) {
        String text;
        try {
            text = Files.readString(file, StandardCharsets.US_ASCII);
        } catch (IOException e) {
            throw new MyriadException.InvalidArgument("TLS: " + file + ": " + e);
        }
        List<byte[]> blocks = new ArrayList<>();
        Matcher matcher = PEM_BLOCK.matcher(text);
        while (matcher.find()) {
            if (!matcher.group(1).equals(label)) {
                continue;
            }
            try {
                blocks.add(Base64.getMimeDecoder().decode(matcher.group(2)));
            } catch (IllegalArgumentException e) {
                throw new MyriadException.InvalidArgument("TLS: " + file + ": bad PEM: " + e.getMessage());
            }
        }
        return blocks;
    }

    /** The certificates of a PEM file (at least one). */
    static List<X509Certificate> readCertificates(Path file) {
        List<byte[]> blocks = pemBlocks(file, "CERTIFICATE");
        if (blocks.isEmpty()) {
            throw new MyriadException.InvalidArgument("TLS: " + file + ": no certificate in the file");
        }
        List<X509Certificate> certificates = new ArrayList<>();
        try {
            CertificateFactory factory = CertificateFactory.getInstance("X.509");
            for (byte[] der : blocks) {
                Collection<? extends Certificate> parsed = factory.generateCertificates(new ByteArrayInputStream(der));
                for (Certificate certificate : parsed) {
                    certificates.add((X509Certificate) certificate);
                }
            }
        } catch (GeneralSecurityException e) {
            throw new MyriadException.InvalidArgument("TLS: " + file + ": " + e.getMessage());
        }
        return certificates;
    }

    /**
     * The private key of a PEM file: PKCS#8 ({@code BEGIN PRIVATE KEY}, what
     * {@code myriad cert} writes), an EC, RSA or Ed25519 key. Other formats are refused
     * with the conversion to run.
     */
    static PrivateKey readPrivateKey(Path file) {
        List<byte[]> blocks = pemBlocks(file, "PRIVATE KEY");
        if (blocks.size() != 1) {
            String other = pemBlocks(file, "EC PRIVATE KEY").isEmpty() && pemBlocks(file, "RSA PRIVATE KEY").isEmpty()
                    ? "no PKCS#8 private key (BEGIN PRIVATE KEY)"
                    : "a SEC1/PKCS#1 key, which the JDK cannot read: convert it with"
                            + " openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8";
            throw new MyriadException.InvalidArgument("TLS: " + file + ": "
                    + (blocks.size() > 1 ? "more than one private key" : other));
        }
        PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(blocks.get(0));
        for (String algorithm : new String[] {"EC", "RSA", "Ed25519"}) {
            try {
                return KeyFactory.getInstance(algorithm).generatePrivate(spec);
            } catch (InvalidKeySpecException e) {
                // not this algorithm: try the next
            } catch (GeneralSecurityException e) {
                throw new MyriadException.InvalidArgument("TLS: " + file + ": " + e.getMessage());
            }
        }
        throw new MyriadException.InvalidArgument("TLS: " + file + ": not an EC, RSA or Ed25519 PKCS#8 key");
    }
}
