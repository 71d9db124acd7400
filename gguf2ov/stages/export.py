"""Export a DFlash draft (a dflash GGUF or a checkpoint folder) to a stateful OpenVINO IR draft.

The graph is built directly with OpenVINO's opset (draft/graph.py), the same graph optimum-intel
exports for its `Qwen3DFlashForCausalLM` (the one class whose forward drops the seed row, so that
the emitted hidden states line up with the candidate tokens GenAI scores with the target's
lm_head). Each weight goes once from the opened source into the IR in the form its variant stores,
so exporting a 1 B draft needs no float32 copy of it, and no PyTorch model. What an export from
optimum's trace could get silently wrong is refused here:

- the tensor names and shapes are compared with the draft model exactly before anything is built
  (`load_state_dict(strict=False)` keeps random weights for misnamed keys: a `model.` prefix);
- the graph is always stateful with `beam_idx` (a stateless draft recomputes its context and is
  never accepted);
- the three rt_info keys GenAI reads are always written.

`build_draft_ir()` returns the `ov.Model` before anything is saved.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..checks.taps import OffsetDecision
from ..draft.config import SELECTOR_LEFT_OUT, SELECTOR_PREFIX
from ..draft.graph import draft_ir_bytes, write_draft_ir
from ..ir.variants import parse_variant, require_source_for
from ..outputs import atomic_dir, relocated, require_space
from ..progress import step
from ..report import Table, human_bytes


@dataclass(frozen=True)
class ExportResult:
    out_dir: str
    source: str
    source_kind: str  # "gguf" | "checkpoint"
    weight_format: str
    hidden_size: int
    num_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    inputs: list[list[str]]  # [name, partial shape, element type]
    outputs: list[list[str]]
    state_variables: int
    rt_info: dict[str, str]
    files: dict[str, int]
    ignored_keys: list[str]
    seconds: float
    verify: object | None = field(default=None)  # the stages.verify.VerifyResult it was validated with
    dflash_version: int = 1
    causal_layers: list[int] = field(default_factory=list)  # layers whose block rows see only earlier rows
    # DFlash 2: what GenAI cannot run and the IR therefore leaves out
    left_out: list[str] = field(default_factory=list)
    offset_decision: OffsetDecision | None = None  # when a target settled an ambiguous offset
    head: object | None = None  # the draft_head.HeadChoice that gave the draft its own embedding and head, or kept GenAI's graft

    def tables(self) -> list[Table]:
        io_rows = [["input", *row] for row in self.inputs] + [["output", *row] for row in self.outputs]
        tables = [
            Table("Draft IR interface", ["kind", "name", "shape", "type"], io_rows,
                  note=f"{self.state_variables} state variables"),
            Table("Draft rt_info", ["key", "value"], [[k, v] for k, v in self.rt_info.items()]),
            Table("Files", ["file", "size"], [[k, human_bytes(v)] for k, v in self.files.items()]),
        ]
        if self.offset_decision is not None:
            tables += self.offset_decision.tables()
        if self.verify is not None:
            tables += self.verify.tables()
        return tables

    def summary(self) -> list[str]:
        lines = [
            f"exported {self.source} ({self.source_kind}) -> {self.out_dir} as {self.weight_format} "
            f"in {self.seconds:.1f} s",
            f"draft: {self.num_layers} layers, hidden {self.hidden_size}, target layers "
            f"{self.target_layer_ids}, mask token {self.mask_token_id}",
        ]
        borrowed = [k for k in self.ignored_keys if k not in self.left_out]
        if borrowed:
            lines.append(f"not exported (GenAI uses the target's): {', '.join(borrowed)}")
        if self.causal_layers:
            lines.append(f"layers {self.causal_layers} attend causally inside the block: sliding layers of a config "
                         "without is_causal, as z-lab's reference runs them (optimum-intel's export attends both ways)")
        if self.dflash_version == 2:
            lines.append(f"DFlash 2: {4 * self.num_layers} dynamic convolutions exported (4 per layer). "
                         + SELECTOR_LEFT_OUT)
        if self.offset_decision is not None:
            lines += self.offset_decision.summary()
        if self.head is not None:
            lines.append(self.head.summary())
        if self.verify is not None:
            lines += self.verify.summary()
        return lines


# --- the stage ------------------------------------------------------------------------------------


def export_draft(draft, out_dir, variant=None, validate=None, overwrite: bool = False, progress: bool = True,
                 observe=None, head=None) -> ExportResult:
    """Export `draft` (a draft.source.DraftSource, opened once by the caller) as one variant (an
    ir.variants.Variant; None: fp32) into `out_dir`, put in place only when complete. `head` (a
    draft.head.HeadChoice) gives it the target's embedding and lm_head of its own, or says why not.

    `validate(folder) -> VerifyResult` runs on the written folder before it is put in place (the
    job's verify against the source and the target): if it raises, nothing is written.
    `observe(name, output, values)` sees each weight as it is made (drift measures it there).
    """
    out_dir, variant = Path(out_dir), variant or parse_variant("fp32")
    require_source_for(variant, draft.kind)
    own = head.own if head is not None else None
    require_space(out_dir, draft_ir_bytes(draft, variant, head), f"the {variant.name} draft")
    start = time.perf_counter()
    with atomic_dir(out_dir, overwrite=overwrite, inputs=(draft.path,)) as tmp:
        info, forms = write_draft_ir(draft, tmp, variant, progress, observe, head=own)
        verified = None
        if validate is not None:
            step("verifying the exported draft against the source, layer by layer", progress)
            verified = validate(tmp)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}

    config = draft.config
    return ExportResult(
        out_dir=str(out_dir), source=str(draft.path), source_kind=draft.kind, weight_format=variant.name,
        hidden_size=config.hidden_size, num_layers=config.num_layers, target_layer_ids=config.target_layer_ids,
        mask_token_id=config.mask_token_id, inputs=info["inputs"], outputs=info["outputs"],
        state_variables=info["state_variables"], rt_info=info["rt_info"], files=files, ignored_keys=draft.ignored,
        seconds=time.perf_counter() - start, dflash_version=2 if config.is_dflash2 else 1,
        causal_layers=[i for i, causal in enumerate(config.causal_layers) if causal],
        left_out=[k for k in draft.ignored if k.startswith(SELECTOR_PREFIX)],
        verify=relocated(verified, tmp, out_dir), offset_decision=draft.offset_decision, head=head,
    )
