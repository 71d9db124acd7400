"""optimum-intel's `Qwen3DFlashForCausalLM`: the PyTorch reference for an exported draft.

`reference_outputs()` runs the class on the draft's own weights without ever holding the draft:
the model is built on the meta device, and each module with weights (fc, the norms, each decoder
layer) receives its tensors from the opened source just before it runs and gives them back just
after, so the peak is one decoder layer in float32. `trace_optimum()` is optimum's own export of
the fully loaded class, the graph `draft_graph` is tested against.
"""

from pathlib import Path

import numpy as np

from .errors import Gguf2ovError
from .source import DraftSource, hf_config

DRAFT_INPUTS = ("inputs_embeds", "hidden_states", "position_ids", "attention_mask")
# the modules that own weights; everything else (rotary tables, the slice) has none
_WEIGHTED = ("fc", "hidden_norm", "norm")


def _torch_tensor(values: np.ndarray):
    import torch

    return torch.from_numpy(np.require(values, dtype=np.float32, requirements="W"))


def streamed_model(draft: DraftSource):
    """The reference class on the meta device, whose weighted modules load themselves on each call."""
    import torch
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    config = hf_config(draft.config)
    with torch.device("meta"):
        model = Qwen3DFlashForCausalLM(config)
    model.rotary_emb = Qwen3RotaryEmbedding(config)  # its inv_freq is computed, not loaded
    modules = [(name, getattr(model, name)) for name in _WEIGHTED]
    modules += [(f"layers.{i}", layer) for i, layer in enumerate(model.layers)]
    for prefix, module in modules:
        names = [f"{prefix}.{k}" for k in module.state_dict()]
        module.register_forward_pre_hook(_loader(draft, module, prefix, names))
        module.register_forward_hook(_unload)
    return model.eval()


def _unload(module, args, output) -> None:
    module.to("meta")  # returning None keeps the output


def _loader(draft: DraftSource, module, prefix: str, names: list[str]):
    def load(m, args):
        state = {n[len(prefix) + 1:]: _torch_tensor(draft.f32(n)) for n in names}
        m.load_state_dict(state, strict=True, assign=True)
    return load


def reference_outputs(draft: DraftSource, calls: list[dict]) -> list[np.ndarray]:
    """last_hidden_state of the reference for consecutive draft calls sharing one KV cache."""
    import torch

    model = streamed_model(draft)
    outputs, past = [], None
    with torch.no_grad():
        for feeds in calls:
            out = model(**{k: torch.from_numpy(np.asarray(feeds[k])) for k in DRAFT_INPUTS}, past_key_values=past,
                        use_cache=True)
            past = out.past_key_values
            outputs.append(out.last_hidden_state.numpy())
    return outputs


def trace_optimum(draft: DraftSource, xml_path):
    """optimum-intel's stateful export of the fully loaded class (the whole draft in memory)."""
    import logging

    import openvino as ov
    import torch
    from optimum.exporters.openvino.convert import export
    from optimum.exporters.openvino.model_configs import Qwen3OpenVINOConfig
    from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM

    config = hf_config(draft.config)
    model = Qwen3DFlashForCausalLM(config).to(torch.float32)
    model.load_state_dict({n: _torch_tensor(draft.f32(n)) for n in draft.names}, strict=True)
    log = logging.getLogger("optimum.exporters.openvino.utils_annotations")
    level = log.level
    log.setLevel(logging.ERROR)  # a draft has no decoder stack to annotate: expected
    try:
        export(model=model.eval(),
               # "text-generation-with-past" raises KeyError; use_past_in_inputs=False gives a graph
               # that patch_stateful silently leaves stateless
               config=Qwen3OpenVINOConfig(config, task="text-generation", use_past=True, use_past_in_inputs=True),
               output=Path(xml_path), stateful=True,
               library_name="transformers")  # else optimum looks for `model.model`, which a draft lacks
    except Exception as e:
        raise Gguf2ovError(f"optimum-intel failed to export the draft: {type(e).__name__}: {e}") from e
    finally:
        log.setLevel(level)
    return ov.Core().read_model(str(xml_path))
