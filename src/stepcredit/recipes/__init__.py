"""Recipes: a command's flow over the components (``train()``, ``evaluate()``), kept apart from them.

:mod:`.experiment` runs a pre-registered comparison of arms over paired seeds (``stepcredit experiment``);
:mod:`.stats` holds its statistics.
"""
