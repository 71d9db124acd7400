"""The file names every stage agrees on."""

IR_XML = "openvino_model.xml"  # a draft IR, and a text target's model
VLM_LANGUAGE_MODEL = "openvino_language_model.xml"
VLM_TEXT_EMBEDDINGS = "openvino_text_embeddings_model.xml"
VLM_PER_LAYER_EMBEDDINGS = "openvino_text_embeddings_per_layer_model.xml"  # Gemma's per-layer inputs
VLM_VISION_EMBEDDINGS = "openvino_vision_embeddings_model.xml"
TOKENIZER_IR = "openvino_tokenizer.xml"
DETOKENIZER_IR = "openvino_detokenizer.xml"
CONFIG_FILE = "config.json"
PROVENANCE_FILE = "gguf2ov.json"
TARGET_MAP_FILE = "gguf2ov_map.yaml"  # the map a target folder was built through with --map, kept in it
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # a sharded checkpoint's
LOCATORS_KEY = "hidden_states_decoder_layers"  # a target's rt_info: where each decoder layer's hidden state is
