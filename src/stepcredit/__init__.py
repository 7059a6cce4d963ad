"""stepcredit: reinforcement learning of language models with verifiable rewards.

The stages live in sub-packages and are imported lazily so that ``import stepcredit`` stays cheap
(no torch import) for users who only want a verifier.
"""

__version__ = "0.1.0"
