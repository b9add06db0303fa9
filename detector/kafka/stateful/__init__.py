"""A Kafka consumer that keeps state per input partition in a compacted, co-partitioned topic.

The worker's confluent-kafka runtime and the pager bridge are two of them. What they share lives
here, once: the state topic's check (`topics`), the restore of assigned partitions to the high
watermark (`recovery`), the rebalance callbacks with lost partitions (`rebalance`) and the
offsets to commit with the state that accounts for them (`checkpoint`).
"""
