"""What tests, benchmarks and the torture harness need to run the product for real: a local
Kafka broker from Maven Central jars, a worker process, and a read_committed reader."""
