"""The messages OVMS parses a `graph.pbtxt` into, declared with `descriptor_pb2` (no protoc), for the tests.

OVMS reads a graph with `TextFormat::ParseFromString` into MediaPipe's `CalculatorGraphConfig`; the
LLM node's options are an `Any` holding OVMS's `LLMCalculatorOptions`. The names, numbers, types,
labels and defaults below are those of (MediaPipe) `mediapipe/framework/calculator.proto`,
`calculator_options.proto`, `mediapipe_options.proto`, `stream_handler.proto`,
`stream_handler/sync_set_input_stream_handler.proto` and (OVMS 2026.4) `src/llm/llm_calculator.proto`,
restricted to what an LLM graph uses: `LLMCalculatorOptions` up to `pipeline_type` (field 19), the
graph and node fields of the LLM graph. A field that is not declared, or misspelt, fails the parse,
as it fails OVMS's.
"""

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, text_format
from google.protobuf.message_factory import GetMessageClass

F = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED, REQUIRED = F.LABEL_OPTIONAL, F.LABEL_REPEATED, F.LABEL_REQUIRED
STRING, BOOL, UINT32, UINT64 = F.TYPE_STRING, F.TYPE_BOOL, F.TYPE_UINT32, F.TYPE_UINT64
MESSAGE, ENUM = F.TYPE_MESSAGE, F.TYPE_ENUM
MAX_FIELD = 536870912  # "extensions 20000 to max": the end of a range is exclusive


def field(name, number, type_, label=OPTIONAL, type_name=None, default=None, extendee=None) -> F:
    f = F(name=name, number=number, type=type_, label=label)
    if type_name:
        f.type_name = type_name
    if default is not None:
        f.default_value = default
    if extendee:
        f.extendee = extendee
    return f


def message(name, fields=(), nested=(), extensions=(), extendable=False, enums=()) -> descriptor_pb2.DescriptorProto:
    m = descriptor_pb2.DescriptorProto(name=name, field=list(fields), nested_type=list(nested),
                                       extension=list(extensions), enum_type=list(enums))
    if extendable:
        m.extension_range.add(start=20000, end=MAX_FIELD)
    return m


def proto_file(name, syntax, messages, deps=()) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto(name=name, package="mediapipe", syntax=syntax,
                                              dependency=list(deps), message_type=list(messages))


PIPELINE_TYPE = descriptor_pb2.EnumDescriptorProto(name="PipelineType", value=[
    descriptor_pb2.EnumValueDescriptorProto(name=n, number=i)
    for i, n in enumerate(("LM", "VLM", "LM_CB", "VLM_CB", "AUTO"))])

LLM_CALCULATOR_OPTIONS = [
    field("models_path", 1, STRING, REQUIRED),
    field("max_num_batched_tokens", 2, UINT64, default="256"),
    field("cache_size", 3, UINT64, default="0"),
    field("max_num_seqs", 4, UINT64, default="256"),
    field("dynamic_split_fuse", 5, BOOL, default="true"),
    field("device", 6, STRING),
    field("plugin_config", 7, STRING, default=""),
    field("best_of_limit", 8, UINT32, default="20"),
    field("max_tokens_limit", 9, UINT32),
    field("enable_prefix_caching", 10, BOOL, default="false"),
    field("draft_models_path", 11, STRING),
    field("draft_device", 12, STRING),
    field("draft_max_num_batched_tokens", 13, UINT64),
    field("draft_cache_size", 14, UINT64),
    field("draft_block_size", 15, UINT64),
    field("draft_max_num_seqs", 16, UINT64),
    field("draft_dynamic_split_fuse", 17, BOOL),
    field("draft_eagle3_mode", 18, BOOL, default="false"),
    field("pipeline_type", 19, ENUM, type_name=".mediapipe.LLMCalculatorOptions.PipelineType", default="AUTO"),
]

NODE = [
    field("name", 1, STRING),
    field("calculator", 2, STRING),
    field("input_stream", 3, STRING, REPEATED),
    field("output_stream", 4, STRING, REPEATED),
    field("input_side_packet", 5, STRING, REPEATED),
    field("node_options", 8, MESSAGE, REPEATED, ".google.protobuf.Any"),
    field("input_stream_handler", 11, MESSAGE, type_name=".mediapipe.InputStreamHandlerConfig"),
    field("input_stream_info", 13, MESSAGE, REPEATED, ".mediapipe.InputStreamInfo"),
]


def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    any_file = descriptor_pb2.FileDescriptorProto()
    any_pb2.DESCRIPTOR.CopyToProto(any_file)
    files = [
        any_file,
        proto_file("mediapipe/framework/mediapipe_options.proto", "proto2",
                   [message("MediaPipeOptions", extendable=True)]),
        proto_file("mediapipe/framework/calculator_options.proto", "proto2",
                   [message("CalculatorOptions", [field("merge_fields", 1, BOOL)], extendable=True)]),
        proto_file("mediapipe/framework/stream_handler.proto", "proto2", [message("InputStreamHandlerConfig", [
            field("input_stream_handler", 1, STRING, default="DefaultInputStreamHandler"),
            field("options", 3, MESSAGE, type_name=".mediapipe.MediaPipeOptions")])],
            deps=["mediapipe/framework/mediapipe_options.proto"]),
        proto_file("mediapipe/framework/stream_handler/sync_set_input_stream_handler.proto", "proto2", [message(
            "SyncSetInputStreamHandlerOptions",
            [field("sync_set", 1, MESSAGE, REPEATED, ".mediapipe.SyncSetInputStreamHandlerOptions.SyncSet")],
            nested=[message("SyncSet", [field("tag_index", 1, STRING, REPEATED)])],
            extensions=[field("ext", 155816273, MESSAGE, type_name=".mediapipe.SyncSetInputStreamHandlerOptions",
                              extendee=".mediapipe.MediaPipeOptions")])],
            deps=["mediapipe/framework/mediapipe_options.proto"]),
        proto_file("mediapipe/framework/calculator.proto", "proto3", [
            message("InputStreamInfo", [field("tag_index", 1, STRING), field("back_edge", 2, BOOL)]),
            message("CalculatorGraphConfig", [
                field("node", 1, MESSAGE, REPEATED, ".mediapipe.CalculatorGraphConfig.Node"),
                field("input_stream", 10, STRING, REPEATED),
                field("output_stream", 15, STRING, REPEATED)], nested=[message("Node", NODE)])],
            deps=["google/protobuf/any.proto", "mediapipe/framework/stream_handler.proto"]),
        proto_file("src/llm/llm_calculator.proto", "proto2", [message(
            "LLMCalculatorOptions", LLM_CALCULATOR_OPTIONS, enums=[PIPELINE_TYPE],
            extensions=[field("ext", 113473750, MESSAGE, type_name=".mediapipe.LLMCalculatorOptions",
                              extendee=".mediapipe.CalculatorOptions")])],
            deps=["mediapipe/framework/calculator_options.proto"]),
    ]
    for f in files:
        pool.Add(f)
    return pool


POOL = _pool()
CalculatorGraphConfig = GetMessageClass(POOL.FindMessageTypeByName("mediapipe.CalculatorGraphConfig"))
LLMCalculatorOptions = GetMessageClass(POOL.FindMessageTypeByName("mediapipe.LLMCalculatorOptions"))


def parse_graph(text: str):
    """The graph as OVMS reads it; raises `text_format.ParseError` on any field these messages lack."""
    return text_format.Parse(text, CalculatorGraphConfig(), descriptor_pool=POOL)


def llm_options(node) -> "LLMCalculatorOptions":
    """The node's `LLMCalculatorOptions`, unpacked from its `Any`."""
    (packed,) = node.node_options
    options = LLMCalculatorOptions()
    assert packed.Unpack(options), packed.type_url
    return options
