"""Live recovery inside a rank process: the survivors go on in a smaller group (internal).

:mod:`.group` (the group's membership and its regroup protocol), with :mod:`.generations`
(the protocol's keys on the job's store), :mod:`.reconfigure` (torch's in-place
reconfigure), :mod:`.membership` (the member's state, the join queue, the way out) and
:mod:`.handoff` (rank 0's state on every member); :mod:`.attach` (the model, optimizer
and loader hooked into it), with :mod:`.hooks` (the DDP comm hook) and :mod:`.deal` (the
Loader's deals); :mod:`.errors` (a lost peer told from a failure).
"""
