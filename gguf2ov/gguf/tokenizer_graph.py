"""Make the graph `openvino_tokenizers.convert_tokenizer` (2026.4) builds tokenize as llama.cpp does.

convert_tokenizer turns the HF tokenizer's steps into OpenVINO string ops. Where its ops differ
from llama.cpp, the node is rebuilt here:

- It joins consecutive regex splits into one regex, `r1|r2`. llama.cpp (like HF's `Sequence`)
  splits by `r1`, then each piece by `r2`: " 12" is " ", "1", "2" under "one digit" then GPT-2's regex,
  and " 12" under their join. So the joined RegexSplit becomes one RegexSplit per regex again.

Its BPETokenizer differs from llama.cpp's BPE in two more places:

- It starts a piece from the longest entry of its vocabulary that no merge makes, where llama.cpp
  starts from characters. So a token no merge reaches would still be found inside text: the byte
  tokens `<0x41>` of a SentencePiece vocabulary (the literal text "<0x41>" became byte 0x41) or
  the `[PAD123]` fillers llama.cpp's converter writes. Their entries get spellings that start with
  0xFF, which never occurs in UTF-8 text; the single raw bytes take over the byte tokens' job
  (the byte fallback of a character that has no token), as entries of their own.
- It has no `ignore_merges`, llama.cpp's lookup of a whole piece in the vocabulary before merging
  (Llama 3: the merges split " Việt", a token). So each piece is looked up first (VocabEncoder)
  and one that is a token is pointed at an 0xFF key that maps to that token.

The vocabulary, merges and ids are `vocab`'s (a `gguf.tokenizer.GgufVocab`).
"""

import numpy as np

_UNMATCHABLE = b"\xff"  # never in UTF-8 text: a vocabulary entry starting with it matches nothing


def match_llama_cpp(tokenizer, vocab, regexes: tuple[str, ...] = ()) -> None:
    """Rebuild the nodes of the `tokenizer` model (in place) for `vocab`, pre-tokenized by `regexes`."""
    if len(regexes) > 1:
        _split_one_regex_after_another(tokenizer, regexes)
    _match_bpe(tokenizer, vocab)


def _split_one_regex_after_another(tokenizer, regexes: tuple[str, ...]) -> None:
    from openvino_tokenizers import _get_factory
    from openvino_tokenizers.utils import create_string_constant_node

    joined = [op for op in tokenizer.get_ordered_ops() if op.get_type_name() == "RegexSplit"]
    if len(joined) != 1:
        raise RuntimeError(f"{len(joined)} RegexSplit nodes: openvino_tokenizers changed how it joins them")
    pieces = [joined[0].input_value(i) for i in range(joined[0].get_input_size() - 1)]
    for regex in regexes:
        pieces = _get_factory().create("RegexSplit", [*pieces, *create_string_constant_node(regex)],
                                       joined[0].get_attributes()).outputs()
    for old, new in zip(joined[0].outputs(), pieces):
        old.replace(new)
    tokenizer.validate_nodes_and_infer_types()


def _match_bpe(tokenizer, vocab) -> None:
    from openvino_tokenizers import _get_factory

    bpe = next(op for op in tokenizer.get_ordered_ops() if op.get_type_name() == "BPETokenizer")
    inputs = [bpe.input_value(i) for i in range(bpe.get_input_size())]
    # inputs: 5 of ragged pieces, 3 of vocabulary strings, 6 of merges (left, right), then the
    # added tokens' 3 of strings and their ids (openvino_tokenizers writes pair merges)
    if len(inputs) != 18:
        raise RuntimeError(f"BPETokenizer with {len(inputs)} inputs: openvino_tokenizers changed its layout")
    pieces, added = inputs[:5], inputs[14:]
    entries, left, right = _strings(inputs[5:8]), _strings(inputs[8:11]), _strings(inputs[11:14])
    if len(entries) != len(vocab.tokens):
        raise RuntimeError(f"BPETokenizer vocabulary of {len(entries)} entries for {len(vocab.tokens)} tokens")
    made = {a + b for a, b in zip(left, right)}
    split = set(vocab.split_ids())
    unreachable = {i for i, token in enumerate(vocab.tokens)
                   if i not in split and len(token) > 1 and entries[i] not in made}
    hidden = {entries[i] for i in unreachable}
    # a merge of a token no merge makes never applies; it would name an entry that is gone
    kept = [k for k in range(len(left)) if left[k] not in hidden and right[k] not in hidden]
    extra = {}  # key -> token id: entries the trie matches whole
    attributes = bpe.get_attributes()
    if attributes.get("byte_fallback"):
        # the raw byte stands for its byte token where no character token has that spelling
        ids = {t: i for i, t in enumerate(vocab.tokens)}
        present = set(entries)
        extra |= {bytes([b]): ids[f"<0x{b:02X}>"] for b in range(256) if bytes([b]) not in present}
        attributes["byte_fallback"] = False
    for i in unreachable:
        entries[i] = _UNMATCHABLE + b"unreachable" + i.to_bytes(4, "big")
    if vocab.pre is not None and vocab.pre.ignore_merges:
        pieces, keys = _look_up_whole_pieces(pieces, vocab, split)
        extra |= keys
    rebuilt = _get_factory().create("BPETokenizer", [
        *pieces, *_string_constant(entries), *_string_constant([left[k] for k in kept]),
        *_string_constant([right[k] for k in kept]), *_append(added, extra)], attributes)
    for old, new in zip(bpe.outputs(), rebuilt.outputs()):
        old.replace(new)
    tokenizer.validate_nodes_and_infer_types()


def _look_up_whole_pieces(pieces, vocab, split: set[int]):
    """Pieces that are whole tokens pointed at keys of their own; (new pieces, {key: token id})."""
    import openvino.opset14 as ops
    from openvino_tokenizers import _get_factory

    ragged, (begins, ends, chars) = pieces[:2], pieces[2:]
    words = _piece_bytes(vocab, [i for i in range(len(vocab.tokens)) if i not in split])
    ids, words = list(words), list(words.values())
    keys = [_UNMATCHABLE + b"whole" + i.to_bytes(4, "big") for i in ids]
    found = _get_factory().create("VocabEncoder", [
        begins, ends, chars, *_string_constant(words),
        ops.constant(np.arange(len(ids), dtype=np.int32)), ops.constant(np.int32(-1))]).output(0)
    key_begins, key_ends, key_chars = _string_constant(keys)
    hit = ops.greater_equal(found, np.int32(0))
    index = ops.maximum(found, np.int32(0))
    offset = ops.convert(ops.shape_of(chars), "i32")  # the keys follow the text's bytes
    begins = ops.select(hit, ops.add(ops.gather(key_begins, index, 0), offset), begins)
    ends = ops.select(hit, ops.add(ops.gather(key_ends, index, 0), offset), ends)
    chars = ops.concat([chars, key_chars], 0)
    return [*ragged, begins.output(0), ends.output(0), chars.output(0)], dict(zip(keys, ids))


def _piece_bytes(vocab, ids: list[int]) -> dict[int, bytes]:
    """{id: the token as the raw bytes of a piece the BPE sees} (byte-level tokens decoded)."""
    if vocab.model != "gpt2":
        return {i: vocab.tokens[i].encode("utf-8") for i in ids}
    from gguf.vocab import bytes_to_unicode

    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    # a token outside the byte alphabet is no piece's spelling: left out
    return {i: bytes(to_byte[c] for c in vocab.tokens[i]) for i in ids if all(c in to_byte for c in vocab.tokens[i])}


def _append(added, extra: dict[bytes, int]):
    """The added tokens' four inputs with `extra` keys after them."""
    import openvino.opset14 as ops

    if not extra:
        return added
    keys, ids = list(extra), np.array(list(extra.values()), np.int32)
    begins, ends, chars = _string_constant(keys)
    shift = ops.convert(ops.shape_of(added[2]), "i32")
    return [ops.concat([added[0], ops.add(begins, shift)], 0).output(0),
            ops.concat([added[1], ops.add(ends, shift)], 0).output(0),
            ops.concat([added[2], chars], 0).output(0),
            ops.concat([added[3], ops.constant(ids)], 0).output(0)]


def _strings(outputs) -> list[bytes]:
    """The byte strings of a (begins, ends, chars) triple of constants."""
    begins, ends, chars = (o.get_node().get_data() for o in outputs)
    raw = chars.tobytes()
    return [raw[b:e] for b, e in zip(begins.tolist(), ends.tolist())]


def _string_constant(strings: list[bytes]):
    from openvino_tokenizers.utils import create_string_constant_node

    return create_string_constant_node(strings)
