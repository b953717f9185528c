"""The control plane's decisions, apart from the job master that carries them out.

- `placement`: which live Ray node each worker slot (and the standby) runs on;
- `detector`: how a lost worker is noticed — heartbeats, dead actors, failed tasks —
  and why each failure happened;
- `recovery`: after a failure, which lost tasks run again now and on which capacity,
  blocking or progressively by query (`RecoveryPlanner`, `RecoveryPolicy`);
- `catchup`: which workers run at the OS's lowest CPU priority while recovering tasks
  catch up, so that the queries a failure did not hit keep their latency
  (`CatchUpPriority`);
- `injector`: carrying out a drill's scheduled kills (what to kill is described in
  `bastion.faults`);
- `pool`: the processes that outlive a job — which idle, live worker a job borrows
  for a slot's node, and when an idle one is let go (`WorkerPool`);
- `resiliency`: how much tuple-level redundancy, period by period
  (`ResiliencyManager`);
- `tuning`: which checkpoint interval keeps the total recovery time under a bound
  (Chiron: profiling, model, optimiser; `bastion tune`).

The job master (`bastion.runtime.job`) calls these; they know nothing of protocols.
"""
