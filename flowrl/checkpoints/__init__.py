"""Checkpoints of fit runs, below the methods that write them and the commands that read them.

- :mod:`~flowrl.checkpoints.paths`: what a checkpoint path on the command line names (a file, a sharded folder, a
  run's folder) and whether it can be a checkpoint, checked before anything loads;
- :mod:`~flowrl.checkpoints.fit` and :mod:`~flowrl.checkpoints.family`: whether a checkpoint's weights fit the method
  and policy a config builds, said in one line before the weights load;
- :mod:`~flowrl.checkpoints.atomic`: saves that never leave a broken checkpoint;
  :mod:`~flowrl.checkpoints.sharded`: FSDP2's sharded checkpoint folders (callback state per rank, read back whole);
- :mod:`~flowrl.checkpoints.loading`: the one loading of a trained policy that ``export`` and ``evaluate`` share.

Nothing here imports :mod:`flowrl.methods`, :mod:`flowrl.strategies` or the command line: a method is passed in (its
class, or its class path) where a check needs it.
"""
