"""The code sandbox: programs run under bubblewrap (or a SandboxFusion server) with rlimits, no network
and hard deadlines, judged case by case (:mod:`.cases`, :mod:`.judging`).

It sits below every stage: the code reward (:mod:`stepcredit.reward.verifiers.code.sandbox`) and the
``python`` tool (:mod:`stepcredit.tools.builtin`) both import it, and it imports neither.
"""
