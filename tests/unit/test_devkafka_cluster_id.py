"""The local broker's cluster id must be one `kafka-storage format --cluster-id` accepts."""

import base64

from detector.devstack.kafka import new_cluster_id


def test_cluster_ids_never_start_with_a_dash() -> None:
    # With the bug, one id in 64 started with "-"; 5,000 draws would show it.
    ids = [new_cluster_id() for _ in range(5000)]
    assert not [i for i in ids if i.startswith("-")]
    assert {len(i) for i in ids} == {22}
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
