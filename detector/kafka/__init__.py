"""Everything that talks to Kafka through confluent-kafka (librdkafka), except the faust agent."""
