"""Histories: recorded events read from disk (`reader`, `logfmt`) and run through a fresh
engine offline (`audit`), keeping the events a report draws (`window`)."""
