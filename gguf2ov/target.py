"""The target model as the draft sees it: tokenizer, hidden-state taps, embedding and lm_head.

A DFlash draft reads the target's hidden states at `target_layer_ids` (located through the
target IR's `hidden_states_decoder_layers` rt_info), embeds its block with the target's token
embedding, and scores its outputs with the target's lm_head. Drift and behaviour checks use the
same three pieces, read from the target's OpenVINO IR.
"""

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from .errors import Gguf2ovError

TARGET_IR = "openvino_model.xml"
TOKENIZER_IR = "openvino_tokenizer.xml"
LOCATORS_KEY = "hidden_states_decoder_layers"


def read_locators(model) -> dict[int, dict] | None:
    """{layer id: {"producer": node name, "output_index": i}} from the target IR, or None."""
    rt = model.get_rt_info()
    if LOCATORS_KEY not in rt:
        return None
    try:
        layers = json.loads(rt[LOCATORS_KEY].astype(str))["layers"]
        return {int(k): v for k, v in layers.items()}
    except (ValueError, KeyError, TypeError) as e:
        raise Gguf2ovError(f"the target's {LOCATORS_KEY} rt_info is not valid JSON with a 'layers' map: {e}") from e


@dataclass
class Target:
    path: Path

    @classmethod
    def open(cls, path) -> "Target":
        path = Path(path)
        if not (path / TARGET_IR).is_file():
            raise Gguf2ovError(
                f"{path} is not an OpenVINO target folder: {TARGET_IR} is missing",
                hint="export the target with optimum-intel (task text-generation-with-past)",
            )
        return cls(path)

    @cached_property
    def model(self):
        import openvino as ov

        return ov.Core().read_model(str(self.path / TARGET_IR))

    @cached_property
    def config(self) -> dict:
        p = self.path / "config.json"
        from .checkpoint import read_json_object

        return read_json_object(p, required=False) or {}

    @cached_property
    def locators(self) -> dict[int, dict] | None:
        return read_locators(self.model)

    @cached_property
    def _weights(self) -> dict[str, np.ndarray]:
        from .irweights import ir_weights

        return ir_weights(self.model, kinds=("MatMul", "Gather"))

    def _find_weight(self, suffix: str) -> np.ndarray:
        for name, w in self._weights.items():
            if name.endswith(suffix):
                return w
        raise Gguf2ovError(f"the target IR in {self.path} has no {suffix} that could be read back")

    @cached_property
    def embedding(self) -> np.ndarray:
        return self._find_weight("embed_tokens.weight")

    @cached_property
    def lm_head(self) -> np.ndarray:
        try:
            return self._find_weight("lm_head.weight")
        except Gguf2ovError:
            return self.embedding  # tied embeddings: the exporter shares one constant

    def tokenize(self, text: str) -> np.ndarray:
        import openvino as ov
        import openvino_tokenizers  # noqa: F401  registers the tokenizer ops

        if not hasattr(self, "_tokenizer"):
            p = self.path / TOKENIZER_IR
            if not p.is_file():
                raise Gguf2ovError(f"the target folder {self.path} has no {TOKENIZER_IR}")
            self._tokenizer = ov.Core().compile_model(str(p), "CPU")
        out = self._tokenizer([text])
        return np.asarray(out["input_ids"]).reshape(-1).astype(np.int64)

    def hidden_states(self, tokens: np.ndarray, layer_ids: list[int]) -> np.ndarray:
        """The concatenated hidden states at `layer_ids` for every position: [T, len(ids) * H]."""
        if not self.locators:
            raise Gguf2ovError(f"the target IR in {self.path} has no {LOCATORS_KEY} rt_info to find its layers")
        missing = [i for i in layer_ids if i not in self.locators]
        if missing:
            raise Gguf2ovError(f"the target has no hidden-state locator for layer ids {missing}")
        request = self._tap_request(tuple(layer_ids))
        request.reset_state()
        t = len(tokens)
        result = request.infer({
            "input_ids": tokens[None], "attention_mask": np.ones((1, t), np.int64),
            "position_ids": np.arange(t, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32),
        })
        taps = [np.asarray(result[request.model_outputs[i + 1]])[0] for i in range(len(layer_ids))]
        return np.concatenate(taps, axis=-1).astype(np.float32)

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        """The target's next-token logits at every position of `tokens` in one pass: [T, vocab] (f32)."""
        request = self._tap_request(())
        request.reset_state()
        t = len(tokens)
        result = request.infer({
            "input_ids": np.asarray(tokens, dtype=np.int64)[None], "attention_mask": np.ones((1, t), np.int64),
            "position_ids": np.arange(t, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32),
        })
        return np.asarray(result[request.model_outputs[0]])[0]

    def greedy(self, tokens: np.ndarray, new_tokens: int) -> np.ndarray:
        """`tokens` followed by the target's own greedy continuation of `new_tokens` tokens (f32)."""
        request = self._tap_request(())
        request.reset_state()
        sequence = [int(t) for t in tokens]
        step = np.asarray(tokens, dtype=np.int64)
        for _ in range(new_tokens):
            t, n = len(sequence), len(step)
            result = request.infer({
                "input_ids": step[None], "attention_mask": np.ones((1, t), np.int64),
                "position_ids": np.arange(t - n, t, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32),
            })
            sequence.append(int(np.asarray(result[request.model_outputs[0]])[0, -1].argmax()))
            step = np.asarray(sequence[-1:], dtype=np.int64)  # the state holds the rest
        return np.asarray(sequence, dtype=np.int64)

    def _tap_request(self, layer_ids: tuple[int, ...]):
        cache = self.__dict__.setdefault("_tap_requests", {})
        if layer_ids not in cache:
            import openvino as ov

            model = ov.Core().read_model(str(self.path / TARGET_IR))
            nodes = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
            outputs = []
            for i in layer_ids:
                loc = self.locators[i]
                if loc["producer"] not in nodes:
                    raise Gguf2ovError(f"target layer {i}: producer {loc['producer']!r} is not in the target graph")
                outputs.append(nodes[loc["producer"]].output(int(loc.get("output_index", 0))))
            model.add_outputs(outputs)
            compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
            cache[layer_ids] = compiled.create_infer_request()
        return cache[layer_ids]
