# shellcheck shell=bash
# kafka-durable (opt-in: a bare `start` skips it): a second Tansu like `kafka`, always on S3
# storage, so its topics and group offsets survive a crash-restart, for the chaos runs
# (DEDUP_KAFKA_DURABLE_BROKERS). Uses kafka.sh.

kafka_durable_packages() { :; }
kafka_durable_alive() { tansu_alive kafka-durable; }
kafka_durable_start() { start_tansu kafka-durable DEDUP_KAFKA_DURABLE_BROKERS s3; }
kafka_durable_stop() { stop_tansu kafka-durable; }
kafka_durable_crash_restart() { crash_restart_tansu kafka-durable; }
