package dev.laminar.spark;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.net.http.HttpClient;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;
import org.apache.http.client.config.RequestConfig;
import org.apache.http.config.RegistryBuilder;
import org.apache.http.conn.socket.ConnectionSocketFactory;
import org.apache.http.conn.socket.PlainConnectionSocketFactory;
import org.apache.http.conn.ssl.DefaultHostnameVerifier;
import org.apache.http.conn.ssl.SSLConnectionSocketFactory;
import org.apache.http.impl.client.CloseableHttpClient;
import org.apache.http.impl.client.HttpClients;
import org.apache.http.impl.conn.BasicHttpClientConnectionManager;

/**
 * The HTTP client of the driver's planning and the executors' reads: HTTP/1.1 keep-alive (the
 * brokers' API), https verified against the CA bundle given (else the JVM's trust store), host
 * names checked, redirects left to the caller (it re-sends the token only to brokers).
 */
final class Http {
  static final String BATCH_TYPE = "application/vnd.laminar.batch";
  static final String NEXT_INDEX = "Laminar-Next-Index";
  static final String COMMIT_INDEX = "Laminar-Commit-Index";
  static final String LOG_START = "Laminar-Log-Start";

  private Http() {}

  /**
   * The executors' client for reads: Apache HttpClient's classic blocking one (in Spark's own
   * jars), one keep-alive connection, no retries, redirects or decompression of its own. Its
   * input buffer hands a large read straight from the socket to the caller's array, so an
   * answer's bytes are copied once; the JDK's client copies them through a queue of fresh
   * 16 KiB buffers, which costs more CPU than the rest of the read.
   */
  static CloseableHttpClient blockingClient(String caFile, long timeoutMs) {
    SSLContext context;
    try {
      context = caFile != null ? trusting(caFile) : SSLContext.getDefault();
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException("no TLS: " + e.getMessage(), e);
    }
    BasicHttpClientConnectionManager connections =
        new BasicHttpClientConnectionManager(
            RegistryBuilder.<ConnectionSocketFactory>create()
                .register("http", PlainConnectionSocketFactory.getSocketFactory())
                .register(
                    "https", new SSLConnectionSocketFactory(context, new DefaultHostnameVerifier()))
                .build());
    int timeout = (int) Math.min(Integer.MAX_VALUE, timeoutMs);
    return HttpClients.custom()
        .setConnectionManager(connections)
        .disableRedirectHandling()
        .disableAutomaticRetries()
        .disableContentCompression()
        .disableCookieManagement()
        .setDefaultRequestConfig(
            RequestConfig.custom().setConnectTimeout(timeout).setSocketTimeout(timeout).build())
        .build();
  }

  static HttpClient client(String caFile, long connectTimeoutMs) {
    HttpClient.Builder builder =
        HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .followRedirects(HttpClient.Redirect.NEVER)
            .connectTimeout(Duration.ofMillis(connectTimeoutMs));
    if (caFile != null) {
      builder.sslContext(trusting(caFile));
    }
    return builder.build();
  }

  /** A TLS context that trusts the certificates of the PEM bundle `caFile`, and only them. */
  static SSLContext trusting(String caFile) {
    try (InputStream in = Files.newInputStream(Path.of(caFile))) {
      KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
      store.load(null, null);
      int n = 0;
      for (Certificate cert : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
        store.setCertificateEntry("ca-" + n++, cert);
      }
      if (n == 0) {
        throw new IllegalArgumentException("option caFile: no certificate in " + caFile);
      }
      TrustManagerFactory trust =
          TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      trust.init(store);
      SSLContext context = SSLContext.getInstance("TLS");
      context.init(null, trust.getTrustManagers(), null);
      return context;
    } catch (IOException e) {
      throw new UncheckedIOException("option caFile: cannot read " + caFile, e);
    } catch (GeneralSecurityException e) {
      throw new IllegalArgumentException("option caFile: " + caFile + ": " + e.getMessage(), e);
    }
  }
}
