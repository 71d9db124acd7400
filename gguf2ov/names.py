"""The file names every stage agrees on, and the one way a model is compiled for comparisons."""

IR_XML = "openvino_model.xml"  # a draft IR, and a text target's model
VLM_LANGUAGE_MODEL = "openvino_language_model.xml"
VLM_TEXT_EMBEDDINGS = "openvino_text_embeddings_model.xml"
VLM_PER_LAYER_EMBEDDINGS = "openvino_text_embeddings_per_layer_model.xml"  # Gemma's per-layer inputs
TOKENIZER_IR = "openvino_tokenizer.xml"
DETOKENIZER_IR = "openvino_detokenizer.xml"
CONFIG_FILE = "config.json"
PROVENANCE_FILE = "gguf2ov.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # a sharded checkpoint's

# The CPU plugin's default bf16 (where the CPU has it) blurs every comparison this tool makes.
F32 = {"INFERENCE_PRECISION_HINT": "f32"}


def compile_f32(model, device: str = "CPU"):
    """An ov.Model or IR path compiled in float32."""
    import openvino as ov

    return ov.Core().compile_model(model if not hasattr(model, "__fspath__") else str(model), device, F32)
