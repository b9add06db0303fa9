"""A Kafka consumer that keeps state per input partition in a compacted, co-partitioned topic.

The worker's confluent-kafka runtime and the pager bridge are two of them. What they share lives
here, once: the state topic's check (`topics`), the restore of assigned partitions to the high
watermark (`recovery`) and the rebalance callbacks with lost partitions (`rebalance`). How each
commits its state with its offsets stays its own: the worker in one Kafka transaction (or a
flush, at least once), the bridge as an acknowledged write before the offsets.
"""
