"""The faust-streaming runtime: one agent, one changelog-backed table, exactly-once output.

faust 0.15.3 + aiokafka 0.14 do not give exactly-once by setting `processing_guarantee` alone
(docs/decisions/0003-faust-runtime-notes.md has the analysis, with file and line). This module
uses faust's own transaction machinery — one transactional producer per input partition, whose
transaction carries the records of the shared `detector.runtime.checkpoint.Checkpoint` (changelog
writes, findings, dead letters) and the consumed offsets — and closes the holes that matter for
us with small documented subclasses:

- `EosTransactionManager` puts every record into the transaction of the input partition it came
  from (faust would send findings and dead letters outside any transaction, #177) and refuses
  every send that would leave a transaction.
- `EosConsumer` commits only between two events, after every write of the events it commits
  has reached the broker (faust's EOS commit does not flush, and it commits in the middle of an
  event), and never past the last event the agent finished (#606).
- `EosConsumerThread` asks the broker for the changelog's last stable offset before recovery
  (faust reads a cached one that is None until the first fetch, and then skips recovery).

Per-workflow state is the engine's `WorkflowState`, stored in the table as `encode_state` bytes
keyed by `workflow_key`, in the same changelog topic and format as the confluent-kafka runtime.
"""

from detector.runtime.faust.worker import run_faust_worker

__all__ = ["run_faust_worker"]
