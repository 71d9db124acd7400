"""optimum-intel's own export of a DFlash draft: the graph `draft/graph.py` is tested against.

It loads the whole draft as a float32 PyTorch model (optimum's `Qwen3DFlashForCausalLM`) and traces
it: tests and fixtures only (`pip install 'gguf2ov[reference]'` for torch and optimum).
"""

from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError, reference_imports
from ..draft.config import hf_config


def trace_optimum(draft, xml_path):
    """optimum-intel's stateful export of the fully loaded class (the whole draft in memory); `draft`: a
    draft.source.DraftSource."""
    import logging

    import openvino as ov

    with reference_imports("tracing optimum-intel's export of a draft"):
        import torch
        from optimum.exporters.openvino.convert import export
        from optimum.exporters.openvino.model_configs import Qwen3OpenVINOConfig
        from optimum.exporters.openvino.model_patcher import Qwen3DFlashForCausalLM

    config = hf_config(draft.config)
    model = Qwen3DFlashForCausalLM(config).to(torch.float32)
    state = {n: torch.from_numpy(np.require(draft.f32(n), np.float32, "W")) for n in draft.names}
    model.load_state_dict(state, strict=True)
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
