"""Stream processors that run the engine against Kafka. Thin: the rules live in `detector.core`."""
