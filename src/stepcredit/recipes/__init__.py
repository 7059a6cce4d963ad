"""Recipes: a command's flow over the components (``train()``, ``evaluate()``), kept apart from them.

:mod:`.experiment` runs a pre-registered comparison of arms over paired seeds (``stepcredit experiment``)
from its parts: :mod:`.spec` (the file), :mod:`.plan` (the checks), :mod:`.runs` (the subprocesses),
:mod:`.summary` (the outputs); :mod:`.stats` holds its statistics.
"""
