"""Rollouts and weights in shared storage: the data path between the trainer and the actor pool (report section 6).

  storage.py       URLs (a directory, s3://, gs://) -> tensorstore kvstores; atomic small objects
  schema.py        the buffer's row layout (BufferSpec, the group fields, their on-disk types)
  buffer.py        RolloutWriter (one append-only shard per actor, commit record last), RolloutReader
  admission.py     the PipelineRL-style budget: how far ahead of the trainer an actor may start a group
  collate.py       committed groups -> the RL batch of c2jax/rl/batch.py
  prefetch.py      the trainer's next batch, read in a background thread during the update
  weight_store.py  versioned, XOR-delta-compressed weights with checksums and a LATEST pointer written last
"""
