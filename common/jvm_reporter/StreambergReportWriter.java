package org.streamberg.reports;

import java.io.IOException;
import java.io.OutputStream;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.Map;
import org.apache.iceberg.metrics.CommitReport;
import org.apache.iceberg.metrics.CommitReportParser;
import org.apache.iceberg.metrics.MetricsReport;
import org.apache.iceberg.metrics.MetricsReporter;
import org.apache.iceberg.metrics.ScanReport;
import org.apache.iceberg.metrics.ScanReportParser;

/**
 * An Iceberg MetricsReporter (catalog property metrics-reporter-impl) that appends every scan
 * and commit report, in Iceberg's own JSON form (ScanReportParser, CommitReportParser), as one
 * line to a file of this JVM in the folder given by the catalog property
 * streamberg.reports-dir. streamberg folds the files into bounded per-table statistics
 * (table_meta/query_stats.py). A report that cannot be written is dropped: a query never fails
 * because of its report.
 */
public class StreambergReportWriter implements MetricsReporter {
  private static final int MAX_FILE_BYTES = 64 * 1024 * 1024;
  private Path file;

  @Override
  public void initialize(Map<String, String> properties) {
    String dir = properties.get("streamberg.reports-dir");
    if (dir == null || dir.isEmpty()) {
      return;
    }
    String pid = ManagementFactory.getRuntimeMXBean().getName().replaceAll("[^0-9A-Za-z]", "-");
    this.file = Paths.get(dir, "reports-" + pid + "-" + System.nanoTime() + ".jsonl");
  }

  @Override
  public void report(MetricsReport report) {
    if (file == null) {
      return;
    }
    String line;
    if (report instanceof ScanReport && ownScan()) {
      return;  // the product's own work (a compaction's stream, a rewrite, a merge): not a query
    }
    if (report instanceof ScanReport) {
      line = "{\"report-type\":\"scan-report\",\"report\":" + ScanReportParser.toJson((ScanReport) report) + "}";
    } else if (report instanceof CommitReport) {
      line = "{\"report-type\":\"commit-report\",\"report\":" + CommitReportParser.toJson((CommitReport) report) + "}";
    } else {
      return;
    }
    write(line.replace('\n', ' ') + "\n");
  }

  /**
   * Whether the scan is streamberg's own work: the Spark local property streamberg.own-scans
   * is "true" on the planning thread (common/spark.own_scans sets it around the product's
   * actions; a streaming query's thread inherits it). Reflection: this class runs in engines
   * without Spark too.
   */
  private static boolean ownScan() {
    try {
      Class<?> context = Class.forName("org.apache.spark.SparkContext");
      Object active = context.getMethod("getOrCreate").invoke(null);
      Object value = context.getMethod("getLocalProperty", String.class).invoke(active, "streamberg.own-scans");
      return "true".equals(value);
    } catch (Throwable e) {
      return false;
    }
  }

  private synchronized void write(String line) {
    try {
      Files.createDirectories(file.getParent());
      if (Files.exists(file, LinkOption.NOFOLLOW_LINKS)) {
        BasicFileAttributes found = Files.readAttributes(file, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
        if (!found.isRegularFile() || found.size() > MAX_FILE_BYTES) {
          return;  // a link or FIFO planted at our name is never followed; bounded: streamberg folds and empties it
        }
      }
      // NOFOLLOW_LINKS: O_NOFOLLOW, so a link put there between the check and the open fails the open.
      try (OutputStream out = Files.newOutputStream(file, StandardOpenOption.CREATE, StandardOpenOption.APPEND,
          StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS)) {
        out.write(line.getBytes(StandardCharsets.UTF_8));
      }
    } catch (IOException | RuntimeException e) {
      // never fail a query for its report
    }
  }
}
