"""Running an exported DFlash draft IR on one block, the way GenAI feeds it.

Inputs: the block's token embeddings (seed token then mask tokens, embedded with the target's
table), the target hidden states of the context before the seed, position ids over context and
block, an all-ones attention mask and beam_idx. The output has one row per block token after the
seed (the seed row is dropped), scored by the target's lm_head.
"""

from functools import cached_property
from pathlib import Path

import numpy as np

from .errors import Gguf2ovError

DRAFT_IR = "openvino_model.xml"


class DraftIR:
    def __init__(self, path):
        self.path = Path(path)
        if not (self.path / DRAFT_IR).is_file():
            raise Gguf2ovError(f"{self.path} is not a draft folder: {DRAFT_IR} is missing")

    @cached_property
    def config(self) -> dict:
        p = self.path / "config.json"
        from .checkpoint import read_json_object

        return read_json_object(p, required=False) or {}

    @cached_property
    def request(self):
        import openvino as ov

        compiled = ov.Core().compile_model(str(self.path / DRAFT_IR), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        return compiled.create_infer_request()

    def run_block(self, block_embeds: np.ndarray, context_hidden: np.ndarray) -> np.ndarray:
        """block_embeds [B, H], context_hidden [C, n_ids*H] -> draft hidden states [rows, H]."""
        request = self.request
        request.reset_state()  # each block is judged on its own context, with an empty cache
        result = request.infer(block_feeds(block_embeds, context_hidden))
        return np.asarray(result[request.model_outputs[0]])[0]


def block_feeds(block_embeds: np.ndarray, context_hidden: np.ndarray, past: int = 0) -> dict[str, np.ndarray]:
    """One draft call: `past` context positions already cached, new context, then the block."""
    b, c = len(block_embeds), len(context_hidden)
    return {
        "inputs_embeds": block_embeds[None].astype(np.float32),
        "hidden_states": context_hidden[None].astype(np.float32),
        "position_ids": np.arange(past, past + c + b, dtype=np.int64)[None],
        "attention_mask": np.ones((1, past + c + b), dtype=np.int64),
        "beam_idx": np.zeros(1, dtype=np.int32),
    }
