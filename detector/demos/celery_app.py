"""A Celery app whose one task sends a welcome email, with the splitbrain adapter installed: the
zombie of the Celery adapter's test and of `splitbrain demo --source celery`.

Run as a worker: `python -m celery -A detector.demos.celery_app worker`. Configured by the
environment: `ZOMBIE_CELERY_BROKER` (a Redis URL), `ZOMBIE_CELERY_TOPIC` (the ownership topic,
default the product's), `ZOMBIE_CELERY_FIRST_S` (how long the first delivery works before it
sends: past the visibility timeout, as a slow SMTP server or a GC pause would make it), and the
`SPLITBRAIN_*` variables of the broker. `acks_late`, a visibility timeout of 3 s, and a restore
scan every second (by default it runs only every ~100 s): the Redis transport hands the
message to another worker while the first one still works on it, and both send the email.
"""

from __future__ import annotations

import os
import time
from typing import Final

from celery import Celery

from detector.adapters import AdapterSink, current, effect_attempted, effect_committed
from detector.adapters.celery import ADAPTER, install
from detector.contracts.topics import INPUT_TOPIC
from detector.demos.celery import BROKER_ENV, FIRST_ENV, SAY, TOPIC_ENV, configure
from detector.kafka.emit import Emitter

TASK: Final = "send_welcome_email"
LATER_S: Final = 0.5  # how long a redelivery works before it sends


app = Celery("splitbrain-zombie", broker=os.environ.get(BROKER_ENV))
configure(app)
_topic = os.environ.get(TOPIC_ENV, INPUT_TOPIC)
install(app, sink=AdapterSink(ADAPTER, publisher=lambda: Emitter.from_env(topic=_topic)))


def send_welcome_email(address: str) -> None:
    owner = current()
    first = owner is not None and owner.owner_epoch == 1
    work_s = float(os.environ.get(FIRST_ENV, "6")) if first else LATER_S
    epoch = owner.owner_epoch if owner is not None else "?"
    print(f"{SAY} epoch {epoch}: rendering the email to {address} ({work_s:g}s)", flush=True)
    time.sleep(work_s)
    effect_attempted(f"email:{address}", destination="smtp")
    print(f"{SAY} epoch {epoch}: sent the email to {address}", flush=True)
    effect_committed(f"email:{address}", destination="smtp")


app.task(name=TASK)(send_welcome_email)
