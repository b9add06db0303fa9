"""What other people's tools rely on: the event and finding models, their JSON Schemas, the
dead-letter headers and the topic names (DESIGN §3, §5, §7)."""
