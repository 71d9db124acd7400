"""The target model as the draft sees it: tokenizer, hidden-state taps, embedding and lm_head.

A DFlash draft reads the target's hidden states at `target_layer_ids` (located through the
target IR's `hidden_states_decoder_layers` rt_info), embeds its block with the target's token
embedding, and scores its outputs with the target's lm_head. Drift and behaviour checks use the
same three pieces, read from the target's OpenVINO IR.

A VLM target folder (optimum-intel's image-text-to-text export) holds the language model, which
takes embeddings, and a text-embeddings model, which makes them from token ids (Gemma scales
them there); GenAI embeds the draft's block with the latter, and so does `embed()`.
"""

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from .errors import Gguf2ovError
from .genai import target_kind
from .names import IR_XML, TOKENIZER_IR, VLM_LANGUAGE_MODEL, VLM_PER_LAYER_EMBEDDINGS, VLM_TEXT_EMBEDDINGS
from .numerics import compile_exact, compile_plain

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
    kind: str = "llm"  # "llm" | "vlm"

    @classmethod
    def open(cls, path) -> "Target":
        path = Path(path)
        kind = target_kind(path)
        if kind is None:
            raise Gguf2ovError(
                f"{path} is not an OpenVINO target folder: neither {IR_XML} nor {VLM_LANGUAGE_MODEL} with "
                f"{VLM_TEXT_EMBEDDINGS}",
                hint="export the target with optimum-intel (task text-generation-with-past, or image-text-to-text)",
            )
        return cls(path, kind)

    @property
    def model_path(self) -> Path:
        return self.path / (VLM_LANGUAGE_MODEL if self.kind == "vlm" else IR_XML)

    @cached_property
    def model(self):
        import openvino as ov

        return ov.Core().read_model(str(self.model_path))

    @cached_property
    def config(self) -> dict:
        """The language model's config (a VLM's `text_config`)."""
        p = self.path / "config.json"
        from .checkpoint import read_json_object

        raw = read_json_object(p, required=False) or {}
        return raw.get("text_config") or raw if "num_hidden_layers" not in raw else raw

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
        """The token embedding table (a text target's; a VLM's lives in its text-embeddings model)."""
        if self.kind == "vlm":
            import openvino as ov

            from .irweights import ir_weights

            weights = ir_weights(ov.Core().read_model(str(self.path / VLM_TEXT_EMBEDDINGS)), kinds=("Gather",))
            found = [w for name, w in weights.items() if name.endswith("embed_tokens.weight")]
            if not found:
                raise Gguf2ovError(f"the text-embeddings model in {self.path} has no embed_tokens.weight that could be read back")
            return found[0]
        return self._find_weight("embed_tokens.weight")

    def embed(self, ids) -> np.ndarray:
        """The embeddings GenAI feeds the draft for token `ids`: [len(ids), H] float32."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.kind != "vlm":
            return self.embedding[ids]
        return self._run_ids_model(VLM_TEXT_EMBEDDINGS, ids)

    def _run_ids_model(self, filename: str, ids: np.ndarray) -> np.ndarray:
        """The single output of one of the VLM's token-id models for `ids` (batch dimension dropped)."""
        requests = self.__dict__.setdefault("_id_models", {})
        if filename not in requests:
            compiled = compile_exact(self.path / filename)  # the draft's inputs, as on every CPU
            requests[filename] = compiled.create_infer_request()
        request = requests[filename]
        out = request.infer({request.model_inputs[0]: np.asarray(ids, dtype=np.int64)[None]})
        return np.asarray(out[request.model_outputs[0]])[0].astype(np.float32)

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
            self._tokenizer = compile_plain(p)
        out = self._tokenizer([text])
        return np.asarray(out["input_ids"]).reshape(-1).astype(np.int64)

    @property
    def tap_layers(self) -> list[int]:
        """Every layer id whose hidden state the target's locators name (what a draft can tap)."""
        return sorted(self.locators or {})

    def hidden_states(self, tokens: np.ndarray, layer_ids: list[int]) -> np.ndarray:
        """The concatenated hidden states at `layer_ids` for every position: [T, len(ids) * H]."""
        return np.concatenate(list(self.layer_states(tokens, layer_ids)), axis=-1)

    def layer_states(self, tokens: np.ndarray, layer_ids: list[int]) -> np.ndarray:
        """The hidden states at each of `layer_ids`, from one pass: [len(ids), T, H] float32.

        One compiled request serves any subset of the layers it taps: ask for all of them at once
        (`tap_layers`) and slice, rather than one pass per subset.
        """
        if not self.locators:
            raise Gguf2ovError(f"the target IR in {self.path} has no {LOCATORS_KEY} rt_info to find its layers")
        missing = [i for i in layer_ids if i not in self.locators]
        if missing:
            raise Gguf2ovError(f"the target has no hidden-state locator for layer ids {missing}")
        request = self._tap_request(tuple(layer_ids))
        request.reset_state()
        result = request.infer(self._feeds(request, tokens, 0))
        taps = [np.asarray(result[request.model_outputs[i + 1]])[0] for i in range(len(layer_ids))]
        return np.stack(taps).astype(np.float32)

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        """The target's next-token logits at every position of `tokens` in one pass: [T, vocab] (f32)."""
        request = self._tap_request(())
        request.reset_state()
        result = request.infer(self._feeds(request, tokens, 0))
        return np.asarray(result[request.model_outputs[0]])[0]

    def greedy(self, tokens: np.ndarray, new_tokens: int) -> np.ndarray:
        """`tokens` followed by the target's own greedy continuation of `new_tokens` tokens (f32)."""
        request = self._tap_request(())
        request.reset_state()
        sequence = [int(t) for t in tokens]
        step = np.asarray(tokens, dtype=np.int64)
        for _ in range(new_tokens):
            result = request.infer(self._feeds(request, step, len(sequence) - len(step)))
            sequence.append(int(np.asarray(result[request.model_outputs[0]])[0, -1].argmax()))
            step = np.asarray(sequence[-1:], dtype=np.int64)  # the state holds the rest
        return np.asarray(sequence, dtype=np.int64)

    def _feeds(self, request, tokens, past: int) -> dict:
        """One forward step over `tokens` after `past` cached positions, in the inputs the model has."""
        tokens = np.asarray(tokens, dtype=np.int64)
        t = past + len(tokens)
        feeds = {"attention_mask": np.ones((1, t), np.int64),
                 "position_ids": np.arange(past, t, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32)}
        names = {name for port in request.model_inputs for name in port.get_names()}
        if "inputs_embeds" in names:
            feeds["inputs_embeds"] = self.embed(tokens)[None]
        else:
            feeds["input_ids"] = tokens[None]
        if "per_layer_inputs" in names and (self.path / VLM_PER_LAYER_EMBEDDINGS).is_file():
            feeds["per_layer_inputs"] = self._run_ids_model(VLM_PER_LAYER_EMBEDDINGS, tokens)[None]  # Gemma's
        if "token_type_ids" in names:
            feeds["token_type_ids"] = np.zeros((1, len(tokens)), np.int64)
        missing = names - set(feeds)
        if missing:
            raise Gguf2ovError(f"the target's {self.model_path.name} takes inputs this tool cannot feed: "
                               f"{', '.join(sorted(missing))}")
        return {k: v for k, v in feeds.items() if k in names}

    def _tap_request(self, layer_ids: tuple[int, ...]):
        cache = self.__dict__.setdefault("_tap_requests", {})
        if layer_ids not in cache:
            import openvino as ov

            model = ov.Core().read_model(str(self.model_path))
            nodes = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
            outputs = []
            for i in layer_ids:
                loc = self.locators[i]
                if loc["producer"] not in nodes:
                    raise Gguf2ovError(f"target layer {i}: producer {loc['producer']!r} is not in the target graph")
                outputs.append(nodes[loc["producer"]].output(int(loc.get("output_index", 0))))
            model.add_outputs(outputs)
            # the offline measurements (tap scan, drift contexts) compare across machines: exact
            compiled = compile_exact(model)
            cache[layer_ids] = compiled.create_infer_request()
        return cache[layer_ids]
