// A Java KCL 3.x consumer for the mixed-fleet tests: the reference
// implementation, run against the same emulators and lease table as kcl's
// e2e-worker, writing the same batch log (one JSON line per batch, the
// fields of kcl_tests::e2e::BatchLog) so one verdict covers both.
//
// Env (the e2e-worker's): KCL_E2E_APP, KCL_E2E_STREAM, KCL_E2E_WORKER_ID,
// KCL_E2E_OUT, KCL_E2E_CHECKPOINT=batch|shutdown, AWS_ENDPOINT_URL_KINESIS,
// AWS_ENDPOINT_URL_DYNAMODB, AWS_REGION and static credentials. Optional:
// KCL_E2E_LEASE_MS (failover time, default 6000, kcl's e2e lease).
// Polling retrieval, metrics off. SIGTERM shuts down gracefully (every
// processor gets shutdownRequested and checkpoints), then the process
// exits 0 (1 if the shutdown did not complete in 30 s).

import java.io.FileWriter;
import java.io.IOException;
import java.io.PrintWriter;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

import software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider;
import software.amazon.awssdk.http.Protocol;
import software.amazon.awssdk.http.nio.netty.NettyNioAsyncHttpClient;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.cloudwatch.CloudWatchAsyncClient;
import software.amazon.awssdk.services.dynamodb.DynamoDbAsyncClient;
import software.amazon.awssdk.services.kinesis.KinesisAsyncClient;
import software.amazon.kinesis.common.ConfigsBuilder;
import software.amazon.kinesis.common.InitialPositionInStream;
import software.amazon.kinesis.common.InitialPositionInStreamExtended;
import software.amazon.kinesis.coordinator.Scheduler;
import software.amazon.kinesis.lifecycle.events.InitializationInput;
import software.amazon.kinesis.lifecycle.events.LeaseLostInput;
import software.amazon.kinesis.lifecycle.events.ProcessRecordsInput;
import software.amazon.kinesis.lifecycle.events.ShardEndedInput;
import software.amazon.kinesis.lifecycle.events.ShutdownRequestedInput;
import software.amazon.kinesis.metrics.MetricsLevel;
import software.amazon.kinesis.metrics.NullMetricsFactory;
import software.amazon.kinesis.processor.ShardRecordProcessor;
import software.amazon.kinesis.processor.SingleStreamTracker;
import software.amazon.kinesis.retrieval.KinesisClientRecord;
import software.amazon.kinesis.retrieval.polling.PollingConfig;

public final class KclJavaWorker {
    private static String env(String name) {
        String v = System.getenv(name);
        if (v == null || v.isEmpty()) {
            throw new IllegalStateException(name + " is not set");
        }
        return v;
    }

    /** Appends one line per batch; shared by every processor of this process. */
    private static final class Log {
        private final PrintWriter out;

        Log(String path) throws IOException {
            out = new PrintWriter(new FileWriter(path, StandardCharsets.UTF_8, true));
        }

        synchronized void close() {
            out.close();
        }

        synchronized void batch(String worker, String shard, long startNs, long endNs, StringBuilder records) {
            out.print("{\"worker\":\"" + worker + "\",\"shard\":\"" + shard + "\",\"start_ns\":" + startNs
                    + ",\"end_ns\":" + endNs + ",\"tenure\":\"\",\"records\":[" + records + "]}\n");
            out.flush();
        }
    }

    /** Wall-clock nanoseconds, as kcl_tests::e2e::now_ns. */
    private static long nowNs() {
        java.time.Instant t = java.time.Instant.now();
        return t.getEpochSecond() * 1_000_000_000L + t.getNano();
    }

    private static final class Processor implements ShardRecordProcessor {
        private final String worker;
        private final Log log;
        private final boolean everyBatch;
        private String shard = "?";

        Processor(String worker, Log log, boolean everyBatch) {
            this.worker = worker;
            this.log = log;
            this.everyBatch = everyBatch;
        }

        @Override
        public void initialize(InitializationInput input) {
            shard = input.shardId();
        }

        @Override
        public void processRecords(ProcessRecordsInput input) {
            long start = nowNs();
            StringBuilder records = new StringBuilder();
            for (KinesisClientRecord r : input.records()) {
                String text = StandardCharsets.UTF_8.decode(r.data().duplicate()).toString();
                // Payloads are "pk-<key>:<counter>" (kcl_tests::TestRecord).
                if (!text.startsWith("pk-") || text.indexOf(':') < 0) {
                    continue;
                }
                String[] parts = text.substring(3).split(":", 2);
                if (records.length() > 0) {
                    records.append(',');
                }
                records.append('[').append(Long.parseLong(parts[0])).append(',').append(Long.parseLong(parts[1]))
                        .append(']');
            }
            if (input.records().isEmpty()) {
                return;
            }
            log.batch(worker, shard, start, nowNs(), records);
            if (everyBatch) {
                checkpoint(input.checkpointer());
            }
        }

        private void checkpoint(software.amazon.kinesis.processor.RecordProcessorCheckpointer cp) {
            try {
                cp.checkpoint();
            } catch (Exception e) {
                System.err.println("checkpoint of " + shard + " failed: " + e);
            }
        }

        @Override
        public void leaseLost(LeaseLostInput input) {}

        @Override
        public void shardEnded(ShardEndedInput input) {
            checkpoint(input.checkpointer());
        }

        @Override
        public void shutdownRequested(ShutdownRequestedInput input) {
            checkpoint(input.checkpointer());
        }
    }

    public static void main(String[] args) throws Exception {
        String app = env("KCL_E2E_APP");
        String stream = env("KCL_E2E_STREAM");
        String worker = env("KCL_E2E_WORKER_ID");
        boolean everyBatch = env("KCL_E2E_CHECKPOINT").equals("batch");
        long leaseMs = Long.parseLong(System.getenv().getOrDefault("KCL_E2E_LEASE_MS", "6000"));
        Region region = Region.of(env("AWS_REGION"));
        Log log = new Log(env("KCL_E2E_OUT"));

        // kinesis-mock and DynamoDB Local speak plain HTTP/1.1.
        KinesisAsyncClient kinesis = KinesisAsyncClient.builder()
                .region(region)
                .endpointOverride(URI.create(env("AWS_ENDPOINT_URL_KINESIS")))
                .credentialsProvider(EnvironmentVariableCredentialsProvider.create())
                .httpClientBuilder(NettyNioAsyncHttpClient.builder().protocol(Protocol.HTTP1_1))
                .build();
        DynamoDbAsyncClient dynamo = DynamoDbAsyncClient.builder()
                .region(region)
                .endpointOverride(URI.create(env("AWS_ENDPOINT_URL_DYNAMODB")))
                .credentialsProvider(EnvironmentVariableCredentialsProvider.create())
                .build();
        // Required by ConfigsBuilder, never called: metrics are off.
        CloudWatchAsyncClient cloudwatch = CloudWatchAsyncClient.builder()
                .region(region)
                .endpointOverride(URI.create("http://127.0.0.1:9"))
                .credentialsProvider(EnvironmentVariableCredentialsProvider.create())
                .build();

        SingleStreamTracker tracker = new SingleStreamTracker(stream,
                InitialPositionInStreamExtended.newInitialPosition(InitialPositionInStream.TRIM_HORIZON));
        ConfigsBuilder configs = new ConfigsBuilder(tracker, app, kinesis, dynamo, cloudwatch, worker,
                () -> new Processor(worker, log, everyBatch));
        Scheduler scheduler = new Scheduler(
                configs.checkpointConfig(),
                configs.coordinatorConfig(),
                configs.leaseManagementConfig().failoverTimeMillis(leaseMs),
                configs.lifecycleConfig(),
                configs.metricsConfig().metricsFactory(new NullMetricsFactory()).metricsLevel(MetricsLevel.NONE),
                configs.processorConfig(),
                configs.retrievalConfig()
                        .retrievalSpecificConfig(new PollingConfig(stream, kinesis).idleTimeBetweenReadsInMillis(500)));

        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                boolean done = scheduler.startGracefulShutdown().get(30, TimeUnit.SECONDS);
                System.err.println("graceful shutdown " + (done ? "completed" : "did not complete"));
                log.close();
                // The JVM would exit 143 after a SIGTERM; a clean stop is 0,
                // as for the e2e-worker.
                Runtime.getRuntime().halt(done ? 0 : 1);
            } catch (Exception e) {
                System.err.println("graceful shutdown failed: " + e);
                Runtime.getRuntime().halt(1);
            }
        }));
        Thread thread = new Thread(scheduler, "scheduler");
        thread.start();
        thread.join();
    }
}
