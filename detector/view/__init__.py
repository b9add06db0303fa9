"""`splitbrain ui`: a read-only view of the findings topic, rendered on the server.

`store` keeps what the topic holds (the latest revision of each finding and its revisions),
`reader` fills it from Kafka, `pages` renders it (pure: findings in, HTML out) and `app` serves
it with Starlette (the `ui` extra). A timeline is drawn from the finding alone (ADR 0006).
"""
