"""Live recovery: a job's survivors go on in a smaller group, and new workers join it.

One room of the launcher (internal). In a rank process: :mod:`.group` (the group's
membership and its regroup protocol), with :mod:`.generations` (the protocol's keys on
the job's store), :mod:`.reconfigure` (torch's in-place reconfigure; a rank alone),
:mod:`.membership` (the member's state, the join queue, the way out) and :mod:`.handoff`
(rank 0's state on every member); :mod:`.attach` (the model, optimizer and loader hooked
into it), with :mod:`.hooks` (the DDP comm hook) and :mod:`.deal` (the Loader's deals);
:mod:`.errors` (a lost peer told from a failure).
On the client: :mod:`.watch` (which ends of ranks the job survives, growth). On the
scheduler and the workers: :mod:`.store` (the job's store), :mod:`.leave` (a closing
worker's ranks leave first). Between them: :mod:`.keys` (every store key and environment
variable) and :mod:`.records` (the typed records that cross a process).
"""
