"""The CPU platform, engines and ``hf`` rollout for verl 0.9: registered in verl when imported.

verl imports this module in every process when ``VERL_USE_EXTERNAL_MODULES`` names it (see
:func:`stepcredit.integrations.verl.cpu.env`); the package docstring says what it adds and why.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import ray
import torch

from stepcredit.integrations.verl.cpu import PLATFORM, ROLLOUT, SERVER_PREFIX

_PLUGINS_POLICY = os.environ.get("VERL_USE_EXTERNAL_PLUGINS")
_DEFER_PLUGINS = "verl" not in sys.modules
if _DEFER_PLUGINS:
    # Imported before verl (a Ray worker unpickling HFServer imports this module first): `import verl`
    # would load the verl.plugins entry points (stepcredit's trainer asks for the platform) before this
    # module has registered it. Import verl without them; they are loaded at the end of this module.
    os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    try:
        import verl  # noqa: F401
    finally:
        if _PLUGINS_POLICY is None:
            del os.environ["VERL_USE_EXTERNAL_PLUGINS"]
        else:
            os.environ["VERL_USE_EXTERNAL_PLUGINS"] = _PLUGINS_POLICY

from verl.plugin.platform.platform_base import PlatformBase  # noqa: E402
from verl.plugin.platform.platform_manager import PlatformRegistry  # noqa: E402

logger = logging.getLogger(__name__)
MODULE = __name__


def check_version() -> None:
    import verl

    version = str(getattr(verl, "__version__", "?"))
    if not version.startswith("0.9."):
        raise RuntimeError(f"stepcredit's CPU platform for verl is written for verl 0.9.x, found {version}")


# ------------------------------------------------------------------------------------------- platform
class _CpuDevice(SimpleNamespace):
    """What verl calls on ``torch.<device>``, for the CPU (memory figures are 0: nothing to manage)."""

    def __getattr__(self, name: str) -> Any:  # anything else: torch.cpu's own (Stream, Event, ...)
        return getattr(torch.cpu, name)


def _noop(*_: Any, **__: Any) -> None:
    return None


def _zero(*_: Any, **__: Any) -> int:
    return 0


def _mem_get_info(*_: Any) -> tuple[int, int]:
    pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return pages * size, os.sysconf("SC_PHYS_PAGES") * size


_NO_OPS = (
    "set_device",
    "synchronize",
    "empty_cache",
    "ipc_collect",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
)
_ZERO_MEMORY = ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved")

CPU_DEVICE = _CpuDevice(
    is_available=lambda: True,
    device_count=lambda: 1,
    current_device=lambda: "cpu",  # verl does tensor.to(get_device_id()): an int would mean cuda:i
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_rng_state=torch.get_rng_state,
    set_rng_state=torch.set_rng_state,
    mem_get_info=_mem_get_info,
    get_device_name=lambda *_: "cpu",
    **dict.fromkeys(_NO_OPS, _noop),
    **dict.fromkeys(_ZERO_MEMORY, _zero),
)


class PlatformCPU(PlatformBase):  # type: ignore[misc]
    """The CPU as a verl platform: gloo collectives, Ray's "GPU" resource (fake GPUs in tests)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return CPU_DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # only ever chosen by VERL_PLATFORM=cpu, never auto-detected

    def current_device(self) -> Any:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for its (fake) GPUs; nothing reads it here

    @contextmanager
    def nvtx_range(self, msg: str) -> Any:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


# verl's engine and rollout modules ask for the platform when imported: only now may they be imported.
PlatformRegistry.register(platform=PLATFORM)(PlatformCPU)
from verl.workers.engine.base import EngineRegistry  # noqa: E402
from verl.workers.rollout import base as rollout_base  # noqa: E402
from verl.workers.rollout.base import BaseRollout  # noqa: E402
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput  # noqa: E402


# -------------------------------------------------------------------------------------------- engines
def _register_engines() -> None:
    """verl's FSDP engines (registered for cuda/npu) for device ``cpu`` too."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, cls in (
        ("language_model", FSDPEngineWithLMHead),
        ("value_model", FSDPEngineWithValueHead),
    ):
        by_backend = EngineRegistry._engines.get(model_type, {})
        backends = [b for b in ("fsdp", "fsdp2") if PLATFORM not in by_backend.get(b, {})]
        if backends:
            EngineRegistry.register(model_type=model_type, backend=backends, device=PLATFORM)(cls)


# -------------------------------------------------------------------------------------------- rollout
class HFServer:
    """One rollout replica: a Hugging Face model that generates for verl's agent loop (token in, token
    out, with the sampled tokens' log-probs) and takes the actor's weights at each sync.

    Requests that arrive together are generated in one batch (left-padded) when their sampling
    parameters agree; generation runs in a thread so that the actor keeps accepting requests.
    """

    def __init__(self, config: Any, model_path: str) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.config = config
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32, attn_implementation="sdpa"
        )
        self.model.eval()
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.model.config.eos_token_id
        self.eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        pad = gen.pad_token_id if gen.pad_token_id is not None else self.model.config.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])
        self.global_steps: int | None = None
        self.weight_syncs = 0
        self._queue: list[tuple[list[int], dict[str, Any], asyncio.Future[TokenOutput]]] = []
        self._lock = threading.Lock()
        self._worker: asyncio.Task[None] | None = None

    def ready(self) -> bool:
        return True

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **_: Any
    ) -> TokenOutput:
        fut: asyncio.Future[TokenOutput] = asyncio.get_running_loop().create_future()
        self._queue.append((list(prompt_ids), dict(sampling_params), fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        await asyncio.sleep(0.05)  # let the agent loop's burst of requests arrive
        while self._queue:
            key = self._params_key(self._queue[0][1])
            batch = [r for r in self._queue if self._params_key(r[1]) == key]
            self._queue = [r for r in self._queue if self._params_key(r[1]) != key]
            try:
                outs = await asyncio.to_thread(self._generate_batch, [r[0] for r in batch], batch[0][1])
                for (_, _, fut), out in zip(batch, outs, strict=True):
                    fut.set_result(out)
            except Exception as e:
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)

    def _params_key(self, sp: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(sp.get(k) for k in ("temperature", "top_p", "top_k", "max_tokens", "logprobs"))

    def _generate_batch(self, prompts: list[list[int]], sp: dict[str, Any]) -> list[TokenOutput]:
        cfg = self.config
        longest = max(map(len, prompts))
        max_new = int(sp.get("max_tokens") or cfg.response_length)
        max_new = max(1, min(max_new, cfg.response_length, cfg.prompt_length + cfg.response_length - longest))
        ids_BP = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        mask_BP = torch.zeros((len(prompts), longest), dtype=torch.long)
        for b, p in enumerate(prompts):  # left padding: every prompt ends at the same column
            ids_BP[b, longest - len(p) :] = torch.tensor(p)
            mask_BP[b, longest - len(p) :] = 1
        temperature = float(sp.get("temperature", 1.0))
        top_k = int(sp.get("top_k", -1))
        with self._lock, torch.no_grad():
            out = self.model.generate(
                input_ids=ids_BP,
                attention_mask=mask_BP,
                max_new_tokens=max_new,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_p=float(sp.get("top_p", 1.0)),
                top_k=top_k if top_k > 0 else 0,
                pad_token_id=self.pad_id,
                eos_token_id=self.eos_ids,
                output_logits=True,
                return_dict_in_generate=True,
            )
        new_BT = out.sequences[:, longest:]
        # log-probs of the sampled tokens under the raw model (temperature 1), as verl's actor computes them
        logp_BT = (
            torch.stack(out.logits, 1).float().log_softmax(-1).gather(-1, new_BT.unsqueeze(-1)).squeeze(-1)
        )
        results = []
        for b in range(len(prompts)):
            tokens = new_BT[b].tolist()
            n = next((i + 1 for i, t in enumerate(tokens) if t in self.eos_ids), len(tokens))
            results.append(
                TokenOutput(
                    token_ids=tokens[:n],
                    log_probs=logp_BT[b, :n].tolist(),
                    stop_reason="completed",
                    extra_fields={"global_steps": self.global_steps},
                )
            )
        return results

    def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the actor's weights (full tensors by name); returns how many were loaded."""
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"rollout hf: weights the model does not have: {unknown[:5]}")
        with self._lock, torch.no_grad():
            for name, t in state.items():
                own[name].copy_(t.to(own[name].dtype))
        self.weight_syncs += 1
        if global_steps is not None:
            self.global_steps = global_steps
        return len(state)

    def stats(self) -> dict[str, Any]:
        return {"weight_syncs": self.weight_syncs, "global_steps": self.global_steps}

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # Nothing to free or pause on a CPU: the lifecycle calls of verl's servers are no-ops here.
    async def wake_up(self, *_: Any, **__: Any) -> None: ...
    async def sleep(self, *_: Any, **__: Any) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def abort_all_requests(self, reject_request: bool = False) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **_: Any) -> None: ...
    async def stop_profile(self) -> None: ...


def _local_path(model_config: Any) -> str:
    """The model's local directory from verl's model config (an HFModelConfig or its DictConfig)."""
    local = getattr(model_config, "local_path", None) if not hasattr(model_config, "_get_node") else None
    if local:
        return str(local)
    from verl.utils.fs import copy_to_local

    return str(copy_to_local(model_config.path))


class HFReplica(RolloutReplica):  # type: ignore[misc]
    """verl's replica for rollout ``hf``: launches one :class:`HFServer` Ray actor (no GPU, no CPU slot)."""

    async def launch_servers(self) -> None:
        name = f"{SERVER_PREFIX}{self.replica_rank}{self.name_suffix}"
        remote_cls: Any = ray.remote(HFServer)
        server = remote_cls.options(name=name, num_cpus=0, max_concurrency=self.max_concurrency).remote(
            self.config, _local_path(self.model_config)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name  # no HTTP endpoint: verl's agent loop calls generate on the handle


class HFServerAdapter(BaseRollout):  # type: ignore[misc]
    """The rollout's side inside the actor worker: hands the actor's weights to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *_: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        self.replica_rank = int(kwargs.get("replica_rank", rank // world))
        self.is_leader = rank % world == 0
        self.sleep_level = 2

    def _server(self) -> Any:
        return ray.get_actor(f"{SERVER_PREFIX}{self.replica_rank}")

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"rollout hf takes full named tensors, not {wire_format!r}")
        global_steps = kwargs.get("global_steps")
        start = time.perf_counter()
        state = {}
        for name, t in weights:  # full tensors (verl gathers FSDP shards); the leader sends them
            full = t.full_tensor() if hasattr(t, "full_tensor") else t
            state[name] = full.detach().to("cpu", copy=True)
        if self.is_leader:
            await self._server().update_weights.remote(state, global_steps)
            logger.info("rollout hf: %d weights synced in %.2f s", len(state), time.perf_counter() - start)


def _gloo_default() -> None:
    """verl builds its default backend string as ``cpu:gloo,<device>:<backend>``, which torch rejects
    when the device is the CPU ("Duplicate device type cpu"): default to plain ``gloo`` instead. The
    function object itself is changed, so the modules that imported it by name see it too."""
    from verl.utils import distributed

    fn = distributed.initialize_global_process_group_ray
    if fn.__defaults__ == (None, None):  # (timeout_second, backend) in verl 0.9.1
        fn.__defaults__ = (None, "gloo")


def _register_rollout() -> None:
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{MODULE}.HFServerAdapter"
    RolloutReplicaRegistry.register(ROLLOUT, lambda: HFReplica)


check_version()
_register_engines()
_register_rollout()
_gloo_default()


_NAMED_PLUGIN_POLICIES: dict[str, set[str] | None] = {"auto": None, "none": set()}
"""verl's plugin policies that are not a list of names -> the plugins they allow (None: every one)."""


def _load_deferred_plugins() -> None:
    """verl's own plugin loading (verl/__init__.py), for the case where it was held back above."""
    from importlib.metadata import entry_points

    policy = (_PLUGINS_POLICY or "auto").strip().lower()
    if policy in _NAMED_PLUGIN_POLICIES:
        allowed = _NAMED_PLUGIN_POLICIES[policy]
    else:  # a comma-separated list of plugin names
        allowed = {n.strip() for n in policy.split(",") if n.strip()}
    for ep in entry_points(group="verl.plugins"):
        if allowed is None or ep.name in allowed:
            try:
                ep.load()
            except Exception as e:  # as verl: a broken plugin must not stop this process
                logger.warning("verl plugin %s failed to load: %s", ep.name, e)


if _DEFER_PLUGINS:
    _load_deferred_plugins()
