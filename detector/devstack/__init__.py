"""The product on one machine, for real: the servers that `splitbrain demo` and `splitbrain dev`
start (a Kafka broker from Maven Central jars, PostgreSQL, Prometheus, Alertmanager, the adapters'
servers), the detector workers and lease agents they run, and the stack that starts and stops
them all. Tests, benchmarks and the torture harness use the same starters (`detector.testing`
builds on this package; this package never imports it)."""
