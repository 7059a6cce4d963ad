"""stepcredit.integrations.verl: the VeRL plugin (the only package that imports verl).

Loaded by verl itself: the ``verl.plugins`` entry point names :mod:`.plugin`, which registers on import

* :mod:`.estimators`: every stepcredit advantage estimator as ``stepcredit_<name>``;
* :mod:`.reward_manager`: the ``stepcredit`` reward manager of verl's reward loop;
* :mod:`.trainer`: the ``stepcredit_sync`` v1 trainer (process rewards from the current actor; GPU-only
  at run time), built on the pure, CPU-tested :mod:`.process`.

Settings are read from the verl config by :mod:`.config`. Supported verl: >=0.9,<0.10.
"""
