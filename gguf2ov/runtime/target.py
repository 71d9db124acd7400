"""The target model as the draft sees it: tokenizer, hidden-state taps, embedding and lm_head.

A DFlash draft reads the target's hidden states at `target_layer_ids` (located through the
target IR's `hidden_states_decoder_layers` rt_info), embeds its block with the target's token
embedding, and GenAI scores its rows with the target's lm_head weight (grafted onto the draft's
`last_hidden_state`: the draft's own final norm, then the head's MatMul). Drift and the tap scan
use the same three pieces, taken from the target's OpenVINO IR as GenAI takes them.

They are found by the graph's structure, not by node names (optimum names them
`aten::embedding`/`aten::linear` in f32 exports and `ov_ext::embedding`/`ov_ext::linear` in 16-bit
and compressed ones): the embedding is the Gather that looks up the `input_ids` Parameter in a
constant table, the head the MatMul that produces the `logits` output (through an Add, a Transpose
or a softcap, as GenAI's `find_llm_matmul` allows); tied heads share the embedding's constant.

Real targets are 4-30 B parameters, so nothing here holds their weights in float32: embedding rows
and head logits come from small compiled sub-models over the weight subgraphs as stored (an int4
table stays int4), and the target itself is compiled once, with every locator as an output, for
its greedy continuation, its logits and its hidden states alike.

A VLM target folder (optimum-intel's image-text-to-text export) holds the language model, which
takes embeddings, and a text-embeddings model, which makes them from token ids (Gemma scales
them there); GenAI embeds the draft's block with the latter, and so does `embed()`.
"""

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from ..errors import Gguf2ovError
from ..names import (CONFIG_FILE, DETOKENIZER_IR, IR_XML, LOCATORS_KEY, TARGET_MAP_FILE, TOKENIZER_IR,
                     VLM_LANGUAGE_MODEL, VLM_PER_LAYER_EMBEDDINGS, VLM_TEXT_EMBEDDINGS)
from ..numerics import compile_exact, compile_plain, core
from ..work import count
from ..ir.irweights import gather_rows, matmul_rows
from ..targets.ir import embedding_lookup, logits_matmul, read_locators

# --- what a target folder must hold -----------------------------------------------------------------


def require_not_gguf_named(what: str, d: Path) -> None:
    if d.suffix.lower() == ".gguf":
        # GenAI reads any path ending in .gguf as a GGUF file, even a folder of IR files.
        raise Gguf2ovError(f"{what} path {d} ends in .gguf; OpenVINO GenAI would read it as a GGUF file",
                           hint="pass the exported OpenVINO folder, renamed without the .gguf suffix")


def target_kind(target_dir) -> str | None:
    """"vlm" for a VLM folder (language model + text embeddings), "llm" for a text model, else None."""
    target_dir = Path(target_dir)
    if (target_dir / VLM_LANGUAGE_MODEL).is_file() and (target_dir / VLM_TEXT_EMBEDDINGS).is_file():
        return "vlm"
    if (target_dir / IR_XML).is_file():
        return "llm"
    return None


def no_target_ir(target_dir: Path) -> Gguf2ovError:
    """The error for a folder that holds no target IR. An IR whose XML was gzipped (to commit or send
    it) is named, with the command that unpacks it: OpenVINO reads the XML itself."""
    packed = sorted(p.name for p in target_dir.glob("*.xml.gz"))
    if packed:
        files = target_dir / (packed[0] if len(packed) == 1 else "*.xml.gz")
        return Gguf2ovError(f"target folder {target_dir} holds {' and '.join(packed)} but no "
                            f"{packed[0].removesuffix('.gz')}: the IR's XML is gzipped, and OpenVINO reads it unpacked",
                            hint=f"unpack it in place: gunzip -k {files}")
    return Gguf2ovError(f"target folder {target_dir} has no {IR_XML} (a text model) nor {VLM_LANGUAGE_MODEL} with "
                        f"{VLM_TEXT_EMBEDDINGS} (a VLM)",
                        hint="export the target with optimum-intel (task text-generation-with-past, or "
                             "image-text-to-text for a VLM)")


def require_target_dir(target_dir) -> "TargetIR":
    """What GenAI needs of a target folder, checked before any work: the IR and its tokenizers. Returns
    the folder opened, its kind read."""
    target_dir = Path(target_dir)
    require_not_gguf_named("target", target_dir)
    if not target_dir.is_dir():
        raise Gguf2ovError(f"target folder {target_dir} does not exist")
    kind = target_kind(target_dir)
    if kind is None:
        raise no_target_ir(target_dir)
    missing = [n for n in (TOKENIZER_IR, DETOKENIZER_IR) if not (target_dir / n).is_file()]
    if missing:
        raise Gguf2ovError(f"target folder {target_dir} has no {' / '.join(missing)}",
                           hint="convert the target's tokenizer with openvino_tokenizers.convert_tokenizer("
                                "tok, with_detokenizer=True); GenAI takes the tokenizer from the target")
    return TargetIR(target_dir, kind)


@dataclass
class TargetIR:
    """An OpenVINO target folder as a draft sees it (optimum-intel's export, or one `gguf2ov target`
    built): read when first used, compiled at most once."""

    path: Path
    kind: str = "llm"  # "llm" | "vlm"

    @classmethod
    def open(cls, path) -> "TargetIR":
        path = Path(path)
        kind = target_kind(path)
        if kind is None:
            raise no_target_ir(path)
        return cls(path, kind)

    @property
    def model_path(self) -> Path:
        return self.path / (VLM_LANGUAGE_MODEL if self.kind == "vlm" else IR_XML)

    @cached_property
    def model(self):
        """The target's language model as read (weights memory-mapped, never converted)."""
        return core().read_model(str(self.model_path))

    @cached_property
    def raw_config(self) -> dict | None:
        """The folder's config.json as written, read once; None when it has none."""
        from ..hf.checkpoint import read_json_object

        return read_json_object(self.path / CONFIG_FILE, required=False)

    @cached_property
    def config(self) -> dict:
        """The language model's config (a VLM's `text_config`); {} without a config.json."""
        raw = self.raw_config or {}
        config = raw if "num_hidden_layers" in raw else raw.get("text_config") or raw
        return config if isinstance(config, dict) else {}

    @property
    def layer_types(self) -> list[str]:
        """The layer types its config states; [] when it states none."""
        from .genai import layer_types

        return layer_types(self.config)

    @cached_property
    def locators(self) -> dict[int, dict] | None:
        return read_locators(self.model)

    @cached_property
    def amap(self):
        """The map its layers are built as (maps.arch_map.ArchMap): the one a folder `gguf2ov target --map`
        built keeps (TARGET_MAP_FILE), else the target map of its model type; None for a model type no map
        builds."""
        from ..maps.load import load_map
        from ..targets.config import map_of_type

        if (self.path / TARGET_MAP_FILE).is_file():
            return load_map(path=self.path / TARGET_MAP_FILE)
        return map_of_type(self.config.get("model_type"))

    @cached_property
    def built_as(self):
        """The config as `gguf2ov target` builds it (target.config.TargetConfig, through `amap`), for an
        architecture this tool builds; None for another, whose checks need no layer kinds, and for a VLM's
        language model (optimum's, which takes embeddings: not the graph `gguf2ov target` builds, even of a
        gemma4 text model)."""
        from ..targets.config import target_config

        if self.kind == "vlm" or self.amap is None:
            return None
        try:
            return target_config(self.config, self.path / CONFIG_FILE, self.amap)
        except Gguf2ovError:
            return None

    def findings(self, taps=()) -> list:
        """What GenAI needs of this target (target.checks.target_findings), `taps` the layer ids a draft
        reads; the paged conversion, which copies the graph, is made once."""
        from ..targets.checks import target_findings

        n_layers = self.config.get("num_hidden_layers")
        return target_findings(self.model, self.built_as, taps, paged=self._paged_findings,
                               num_layers=n_layers if isinstance(n_layers, int) else None,
                               embedding_model=self._embedding_model)

    @cached_property
    def _paged_findings(self):
        from ..targets.checks import paged_findings

        return paged_findings(self.model, self.built_as) if self.built_as is not None else None

    @cached_property
    def _embedding_model(self):
        """The model whose Gather looks token ids up: the target's own, or a VLM's text-embeddings model."""
        return core().read_model(str(self.path / VLM_TEXT_EMBEDDINGS)) if self.kind == "vlm" else self.model

    @cached_property
    def embedding(self):
        """The token-embedding Gather (in the text-embeddings model of a VLM)."""
        where = self.path / (VLM_TEXT_EMBEDDINGS if self.kind == "vlm" else IR_XML)
        return embedding_lookup(self._embedding_model, where)

    @cached_property
    def head(self):
        """The lm_head MatMul, whose weight GenAI grafts onto the draft."""
        return logits_matmul(self.model, self.model_path)

    # everything that holds the IR's mapping or a compiled copy of its weights
    _HOLDING_THE_IR = ("_request", "_rows_requests", "_head_request", "_id_models", "embedding", "head",
                       "_embedding_model", "model")

    def release(self) -> None:
        """Drop the compiled target, its sub-models and the model read for them: the CPU plugin holds
        the IR's mapped pages and its repacked weights, ~2.2x the IR (4.6 GiB for a 2.1 GiB int4 4B
        target, measured), and the pages stay counted while any node of the model is alive, twice
        once GenAI maps the file too. The next use reads and compiles again."""
        for name in self._HOLDING_THE_IR:
            self.__dict__.pop(name, None)

    def require_attach_points(self) -> "TargetIR":
        """The embedding Gather and the head MatMul that GenAI attaches a draft to, found before any
        work: a target without them gets one error naming what was looked for."""
        self.embedding, self.head  # noqa: B018  (each raises what it looked for)
        return self

    @property
    def tied(self) -> bool:
        """Whether the head multiplies by the embedding's own constant (one table for both)."""
        if self.kind == "vlm":
            return False  # separate IRs: each holds its own copy
        return self.head.input_value(1).get_node().get_name() == self.embedding.input_value(0).get_node().get_name()

    @property
    def vocab_size(self) -> int:
        shape = self.head.get_output_partial_shape(0)
        return shape[shape.rank.get_length() - 1].get_length()

    @property
    def hidden_size(self) -> int:
        shape = self.head.input_value(0).get_partial_shape()
        return shape[shape.rank.get_length() - 1].get_length()

    # --- the draft's side: its block's embeddings, its rows' logits ------------------------------------

    def embed(self, ids) -> np.ndarray:
        """The embeddings GenAI feeds the draft for token `ids`: [len(ids), H] float32."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.kind == "vlm":
            return self._run_ids_model(VLM_TEXT_EMBEDDINGS, ids)
        return self.rows(self.embedding.input_value(0))(ids)

    @cached_property
    def embeds_scale(self) -> float:
        """What the embeddings GenAI feeds a draft (`embed`) are its embedding table's rows multiplied by:
        1 where it grafts the table (an LLM target), the text embeddings model's own factor for a VLM (Gemma
        scales by sqrt(hidden) there), measured on rows spread over the vocabulary."""
        if self.kind != "vlm":
            return 1.0
        table = self.embedding.input_value(0)
        ids = np.linspace(0, table.get_partial_shape()[0].get_length() - 1, 64).astype(np.int64)
        rows, fed = self.rows(table)(ids), self.embed(ids)
        scale = float(np.linalg.norm(fed) / max(float(np.linalg.norm(rows)), 1e-30))
        if not np.allclose(fed, rows * np.float32(scale), rtol=1e-3, atol=1e-3 * float(np.abs(fed).max())):
            raise Gguf2ovError(f"{self.path / VLM_TEXT_EMBEDDINGS}: its output is not its table's rows times one "
                               "factor, so a draft's input_embedding_scale cannot be fitted to it",
                               hint="attach the draft to the text target (gguf2ov target without --mmproj)")
        return scale

    def rows(self, weight):
        """rows(ids) -> [len(ids), ...] float32: rows of one of the target's weights (its embedding table,
        its head's [vocab, hidden] weight), compiled once (`gather_rows`)."""
        requests = self.__dict__.setdefault("_rows_requests", {})
        key = weight.get_node().get_name()
        if key not in requests:
            requests[key] = gather_rows(weight)
        return requests[key]

    def head_logits(self, rows: np.ndarray) -> np.ndarray:
        """The target's lm_head on the draft's rows [n, H] -> [n, vocab] float32, as GenAI grafts it
        (the head's MatMul alone: the draft applies its own final norm)."""
        if "_head_request" not in self.__dict__:
            self._head_request = matmul_rows(self.head)
        return self._head_request(rows)

    def _run_ids_model(self, filename: str, ids: np.ndarray) -> np.ndarray:
        """The single output of one of the VLM's token-id models for `ids` (batch dimension dropped)."""
        requests = self.__dict__.setdefault("_id_models", {})
        if filename not in requests:
            compiled = compile_exact(self.path / filename)  # the draft's inputs, as on every CPU
            requests[filename] = compiled.create_infer_request()
        request = requests[filename]
        out = request.infer({request.model_inputs[0]: np.asarray(ids, dtype=np.int64)[None]})
        return np.asarray(out[request.model_outputs[0]])[0].astype(np.float32)

    # --- the target's own run ------------------------------------------------------------------------

    def tokenize(self, text: str) -> np.ndarray:
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
        """The hidden states at each of `layer_ids`, from one pass: [len(ids), T, H] float32."""
        if not self.locators:
            raise Gguf2ovError(f"the target IR in {self.path} has no {LOCATORS_KEY} rt_info to find its layers")
        missing = [i for i in layer_ids if i not in self.locators]
        if missing:
            raise Gguf2ovError(f"the target has no hidden-state locator for layer ids {missing}")
        request, outputs = self._request
        request.reset_state()
        result = request.infer(self._feeds(request, tokens, 0))
        return np.stack([np.asarray(result[outputs[i]])[0] for i in layer_ids]).astype(np.float32)

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        """The target's next-token logits at every position of `tokens` in one pass: [T, vocab] (f32)."""
        request, _ = self._request
        request.reset_state()
        result = request.infer(self._feeds(request, tokens, 0))
        return np.asarray(result[request.model_outputs[0]])[0]

    def greedy(self, tokens: np.ndarray, new_tokens: int) -> np.ndarray:
        """`tokens` followed by the target's own greedy continuation of `new_tokens` tokens (f32)."""
        request, _ = self._request
        request.reset_state()
        count("target greedy continuations (gguf2ov)")
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

    @cached_property
    def _request(self):
        """The target compiled once, with every located layer as an extra output: (request, {layer id:
        its output port}). One compile serves the greedy continuation, the logits and any tap set."""
        model = self.model.clone()  # add_outputs would change the model every other reader shares
        nodes = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
        extra = []
        for i, loc in sorted((self.locators or {}).items()):
            if loc.get("producer") not in nodes:
                raise Gguf2ovError(f"target layer {i}: producer {loc.get('producer')!r} is not in the target graph")
            extra.append((i, nodes[loc["producer"]].output(int(loc.get("output_index", 0)))))
        ports = model.add_outputs([o for _, o in extra]) if extra else []
        # the offline measurements (tap scan, drift contexts) compare across machines: exact
        count("target compiles (gguf2ov)")
        compiled = compile_exact(model)
        first = len(compiled.outputs) - len(ports)
        outputs = {i: compiled.outputs[first + k] for k, (i, _) in enumerate(extra)}
        del model
        return compiled.create_infer_request(), outputs
