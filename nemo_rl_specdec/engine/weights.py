"""Weight routing and in-place loading for a live vLLM engine (GPU and CPU).

Owns: splitting a policy update's tensors between target and drafter by name, shipping
tensors across process boundaries (safetensors bytes or a path), finding the drafter module,
loading weights in place with verification, and content fingerprints of a model.

Facts this rests on (reference/vllm_cpu_experiments.md, drafters_cpu.md):
- a raw `load_weights` into a live CPU engine fails (Linear weights are repacked and emptied);
  vLLM's layerwise reload works, plus re-packing modules that keep their weight (tied lm_head);
- MTP/Eagle drafters may share embed_tokens/lm_head with the target (same Parameter object):
  those names are never loaded into the drafter separately;
- the target's `load_weights` drops MTP tensors, so they must be fed to the drafter.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from nemo_rl_specdec.engine.vllm_compat import marked

DRAFT_PREFIX = "draft."
MTP_PREFIXES = ("mtp.", "model.mtp_layers.")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")

WeightsPayload = bytes | str | Path | dict | list | None


class WeightLoadError(RuntimeError):
    """A weight update did not land completely; the message names what is missing or unmatched."""


def split_policy_and_drafter(named_tensors: Iterable[tuple[str, Any]], num_hidden_layers: int | None):
    """Route (name, tensor) pairs: `draft.*` (prefix stripped), `mtp.*`, `model.mtp_layers.*` and
    `model.layers.{>= num_hidden_layers}.*` go to the drafter; everything else to the policy."""
    policy, drafter = [], []
    for name, t in named_tensors:
        if name.startswith(DRAFT_PREFIX):
            drafter.append((name[len(DRAFT_PREFIX):], t))
        elif name.startswith(MTP_PREFIXES):
            drafter.append((name, t))
        else:
            m = _LAYER_RE.match(name)
            if m and num_hidden_layers is not None and int(m.group(1)) >= num_hidden_layers:
                drafter.append((name, t))
            else:
                policy.append((name, t))
    return policy, drafter


def decode_weights(payload: WeightsPayload) -> list[tuple[str, torch.Tensor]]:
    """bytes (safetensors) | path (file or dir of *.safetensors) | dict | list -> [(name, tensor)]."""
    if payload is None:
        return []
    if isinstance(payload, (bytes, bytearray)):
        from safetensors.torch import load

        return list(load(bytes(payload)).items())
    if isinstance(payload, (str, Path)):
        from safetensors.torch import load_file

        p = Path(payload)
        files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
        if not files or not all(f.exists() for f in files):
            raise WeightLoadError(f"weights path {str(p)!r} has no safetensors file")
        out: list[tuple[str, torch.Tensor]] = []
        for f in files:
            out.extend(load_file(str(f)).items())
        return out
    if isinstance(payload, dict):
        return list(payload.items())
    return list(payload)


def unwrap(model):
    return model.unwrap() if hasattr(model, "unwrap") else model


def find_drafter_model(worker) -> Any | None:
    """The drafter model of a live vLLM worker, unwrapped, wherever this vLLM version keeps it:
    `worker.get_draft_model()` (vLLM >= 0.32), else the V1 runner's `model_runner.drafter.model`,
    else model runner v2's `model_runner.speculator.model` (the default for Eagle/MTP in vLLM
    0.25.1, which NeMo-RL 0.6.0's own lookup does not look at); a holder's `model` counts when it
    is an nn.Module or has `load_weights`. None for model-free drafters (ngram, suffix, custom).
    Our engine's worker extension and the NeMo-RL adapter's drafter lookup both use it."""
    getter = getattr(worker, "get_draft_model", None)
    if callable(getter):
        try:
            m = getter()
        except AttributeError:
            m = None
        if m is not None:
            return unwrap(m)
    runner = getattr(worker, "model_runner", None)
    for attr in ("drafter", "speculator"):
        holder = getattr(runner, attr, None)
        m = getattr(holder, "model", None)
        if isinstance(m, torch.nn.Module) or callable(getattr(m, "load_weights", None)):
            return unwrap(m)
    return None


def shared_parameter_names(drafter: torch.nn.Module, target: torch.nn.Module) -> set[str]:
    """Drafter parameter names whose Parameter object is the target's (e.g. MTP embed/lm_head)."""
    tgt = {id(p) for p in target.parameters()}
    return {n for n, p in drafter.named_parameters(remove_duplicate=False) if id(p) in tgt}


def _matches_shared(name: str, shared: set[str]) -> bool:
    alt = name.replace("midlayer.", "layers.0.")  # EAGLE layout spells layer 0 `midlayer.`
    return any(s == name or s == alt or s.endswith("." + name) or s.endswith("." + alt) for s in shared)


def load_inplace(model: Any, model_config, items: list[tuple[str, torch.Tensor]],
                 *, skip_shared: set[str] | None = None, require_complete: bool = True,
                 what: str = "model") -> dict:
    """Load checkpoint-format tensors into a live model in place and verify they landed.

    Returns {"loaded": n, "skipped_shared": [...]}; raises WeightLoadError naming unmatched
    tensor names (the model's loader rejects them) or parameters left without new values.
    """
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    skipped: list[tuple[str, torch.Tensor]] = []
    if skip_shared:
        kept: list[tuple[str, torch.Tensor]] = []
        for n, t in items:
            (skipped if _matches_shared(n, skip_shared) else kept).append((n, t))
        items = kept
    if not items:
        raise WeightLoadError(f"{what}: the update carries no tensors to load")
    expected = {n for n, _ in model.named_parameters()}
    if skip_shared:
        expected -= skip_shared
    initialize_layerwise_reload(model)
    try:
        loaded = model.load_weights(iter(items))
    except (KeyError, ValueError, AttributeError) as e:
        # restore the packed kernel tensors before reporting, so the engine stays usable
        finalize_layerwise_reload(model, model_config)
        _repack_kept_weights(model)
        raise WeightLoadError(f"{what}: a tensor name matches no parameter ({type(e).__name__}: {e})") from None
    finalize_layerwise_reload(model, model_config)
    _repack_kept_weights(model)
    if loaded is not None and require_complete:
        missing = sorted(expected - set(loaded))
        if missing:
            head = ", ".join(missing[:8]) + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else "")
            raise WeightLoadError(f"{what}: update incomplete, {len(missing)} parameter(s) got no new value: {head}")
    return {"loaded": len(items), "skipped_shared": [n for n, _ in skipped]}


def cpu_reloading(model: Any, model_config) -> None:
    """Make `model.load_weights(weights)` reload in place on vllm-cpu (layerwise reload and re-pack
    around the model's own loader), for callers that load raw, as NeMo-RL's extension does."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    raw = model.load_weights
    if getattr(raw, "_specdec_cpu_reloading", False):
        return

    def load_weights(weights):
        initialize_layerwise_reload(model)
        try:
            return raw(weights)
        finally:
            finalize_layerwise_reload(model, model_config)
            _repack_kept_weights(model)

    model.load_weights = marked(load_weights, "_specdec_cpu_reloading")


def _repack_kept_weights(model: torch.nn.Module) -> None:
    """CPU only: modules that keep their weight next to a packed copy (embedding, tied lm_head)
    are not re-packed by the layerwise reload; re-run their weight processing."""
    for m in model.modules():
        w = getattr(m, "weight", None)
        quant = getattr(m, "quant_method", None)
        if hasattr(m, "cpu_linear") and quant is not None and isinstance(w, torch.Tensor) and w.numel() > 0:
            quant.process_weights_after_loading(m)


_PROBE_ROWS = 2
_MAX_HASHED = 1 << 20


def fingerprint(model: torch.nn.Module, exclude: set[str] | None = None) -> str:
    """Content fingerprint of a live model, readable on CPU where Linear weights are packed:
    readable parameters and buffers (a rotary cache, a draft vocabulary map: what a level-2 sleep
    discards beside the weights) are hashed (strided beyond 1M elements); Linear layers whose weight
    was emptied are probed through their kernel with a fixed input (a random projection of W)."""
    exclude = exclude or set()
    h = hashlib.blake2b(digest_size=16)
    gen = torch.Generator().manual_seed(1234)
    for mname, mod in sorted(model.named_modules(), key=lambda kv: kv[0]):
        tensors = [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]
        for pname, p in sorted(tensors, key=lambda kv: kv[0]):
            full = f"{mname}.{pname}" if mname else pname
            if full in exclude:
                continue
            if p.numel() > 0:
                flat = p.detach().reshape(-1)
                if flat.numel() > _MAX_HASHED:
                    flat = flat[:: flat.numel() // _MAX_HASHED + 1]
                h.update(full.encode())
                h.update(flat.float().cpu().numpy().tobytes())
            elif pname == "weight" and hasattr(mod, "quant_method") and hasattr(mod, "input_size_per_partition"):
                d = int(mod.input_size_per_partition)
                # drawn on the host (where the generator is, so the probe is the same on every device),
                # then moved to where the kernel keeps the packed weight
                probe = torch.randn(_PROBE_ROWS, d, generator=gen, device="cpu")
                probe = probe.to(device=p.device, dtype=_dtype_of(mod))
                with torch.no_grad():
                    out = mod.quant_method.apply(mod, probe, None)
                h.update(full.encode())
                h.update(out.float().cpu().numpy().tobytes())
    return h.hexdigest()


def _dtype_of(mod: torch.nn.Module) -> torch.dtype:
    for p in mod.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.get_default_dtype()
