"""The emitter refuses what a detector would have to repair: no broker is needed for that."""

import pytest

from detector.contracts.events import EventError
from detector.kafka.emit import Emitter

EVENT = {
    "kind": "heartbeat",
    "workflow_key": "wf",
    "owner_epoch": 3,
    "worker_id": "w1",
}


def test_an_invalid_optional_field_is_an_error_for_the_emitter_s_caller() -> None:
    emitter = Emitter({"bootstrap.servers": "127.0.0.1:9"})
    try:
        with pytest.raises(EventError) as caught:
            emitter.emit(EVENT, lease_duration_s=0)
        assert caught.value.field == "lease_duration_s"
        assert emitter.sent == 0
    finally:
        emitter.close()
