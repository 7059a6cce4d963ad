"""verl 0.9 on CPU, through verl's own extension points: for tests and debugging, never for speed.

verl 0.9.1 cannot train on a CPU out of the box: only the nvidia/npu/rocm platforms are registered (an
unknown machine falls back to nvidia and dies on "Distributed package doesn't have NCCL built in"), its
FSDP engines are registered for cuda/npu only, and its rollout registries hold only vllm, sglang and
trtllm. Its :mod:`~stepcredit.integrations.verl.cpu.backend` adds, when imported (verl imports it in
every process, Ray workers included, when ``VERL_USE_EXTERNAL_MODULES`` names it, see :func:`env`;
importing this package itself imports nothing from verl):

* the ``cpu`` platform (``VERL_PLATFORM=cpu``): torch's CPU device, ``gloo`` for collectives, and Ray's
  "GPU" resource name, so that a Ray started with fake GPUs (``ray_kwargs.ray_init.num_gpus=1``)
  satisfies verl's resource pools;
* verl's FSDP engines (language model and value model) registered for device ``cpu``; verl's default
  process-group backend string (``cpu:gloo,<device>:<backend>``, which torch refuses when both are the
  CPU) turned into plain ``gloo``;
* rollout ``hf``: a small server (one Ray actor per replica) that generates with Hugging Face
  ``generate`` and takes the actor's weights at each sync (``actor_rollout_ref.rollout.name=hf``).

Also needed on the verl command line (:data:`OVERRIDES`): ``strategy=fsdp2`` (fsdp1 refuses CPU
parameters with ``sync_module_states``), ``sdpa`` attention (verl's default is flash-attention-2), no
torch.compile, one agent-loop worker, one reward worker and one TransferQueue storage unit (each is a Ray
process), tensor parallel 1. Run with: the actor and the ``hf`` rollout (GRPO-style, v1 trainer). Not
run: a reference model (its CPU offload policy needs ``pin_memory=False``) and a critic (verl's
value-head model hard-codes flash-attention-2). Written against verl 0.9.1; the backend refuses any
verl outside 0.9.x.
"""

from __future__ import annotations

PLATFORM = "cpu"
"""verl platform name (``VERL_PLATFORM=cpu``)."""
ROLLOUT = "hf"
"""verl rollout name (``actor_rollout_ref.rollout.name=hf``)."""
MODULE = "stepcredit.integrations.verl.cpu.backend"
"""The module that registers everything in verl when imported (``VERL_USE_EXTERNAL_MODULES``)."""
SERVER_PREFIX = "stepcredit_hf_server_"
"""Ray actor name of the rollout server of replica r: SERVER_PREFIX + str(r)."""

OVERRIDES = (
    "trainer.device=cpu",
    "+ray_kwargs.ray_init.num_gpus=1",
    "+ray_kwargs.ray_init.include_dashboard=false",
    f"actor_rollout_ref.rollout.name={ROLLOUT}",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "critic.strategy=fsdp2",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "data.dataloader_num_workers=0",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "+critic.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=false",
)
"""verl command-line overrides that every CPU run needs next to :func:`env`."""


def env() -> dict[str, str]:
    """Environment variables that make every verl process (driver and Ray workers) load :data:`MODULE`.
    Importing this package itself imports nothing from verl."""
    return {"VERL_PLATFORM": PLATFORM, "VERL_USE_EXTERNAL_MODULES": MODULE}
