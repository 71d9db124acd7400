"""llama.cpp's BPE pre-tokenizers, as data: which regexes `tokenizer.ggml.pre` selects.

Transcribed from llama.cpp 0c1e570 (`src/llama-vocab.cpp`: the `tokenizer_pre` chain in
`llama_vocab::impl::load` and the regex table in `llm_tokenizer_bpe`). llama.cpp applies a type's
regexes one after the other; each one splits every piece into its matches and the text between
them (HF's `Split` with behaviour `Isolated`). `tests/data/llamacpp_tokens.json` records what
llama.cpp's own `llama-tokenize` gives for every type listed here, and the tests compare against it.

Left out on purpose, so that a file naming them gets an error rather than other ids: types that
llama.cpp tokenizes with hand-written code instead of its regex (`kimi-k2`, `afmoe`, `tiny_aya`,
`superbpe`), and the BPE types without GPT-2 byte encoding (`gemma4`, `sarvam-moe`, `whitespace`).
"""

import re
from dataclasses import dataclass

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_CJK = r"[一-龥ࠀ-一가-퟿]+"
_KANA = r"[一-龥぀-ゟ゠-ヿ]+"
_PUNCT_WORDS = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
_CASED = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:CONTRACTIONS)?"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:CONTRACTIONS)?")
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"

# llama.cpp pre-tokenizer type -> its regexes, in the order llama.cpp applies them.
PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "jais2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
              r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",),
    "deepseek-llm": (
        "[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
        "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
        "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
        "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
        "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
        "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
        "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
        "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
        "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
        "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
        "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+$",
        _CJK,
        r"\p{N}+",
    ),
    "deepseek3": (r"\p{N}{1,3}", _KANA,
                  _PUNCT_WORDS + r"| ?[\p{P}\p{S}]+[" "\r\n" r"]*|\s*[" "\r\n" r"]+|\s+(?!\S)|\s+"),
    "spark2_5": (r"\p{N}{1,3}", _KANA,
                 _PUNCT_WORDS + r"| ?[\p{P}\p{S}]+|[" "\r\n" r"]|\s+(?!\S)|\s+", r"\p{N}"),
    "youtu": (
        r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|" + _KANA,
        (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:CONTRACTIONS)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:CONTRACTIONS)?"
         r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    ),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", _GPT2),
    "gpt2": (_GPT2,),
    "qwen2": (_QWEN2,),
    "qwen35": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "bloom": (_BLOOM,),
    "viking": (_BLOOM, r"\p{N}"),
    "tekken": (_CASED.replace("(?:CONTRACTIONS)?", "")
               + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "gpt4o": (_CASED + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "granite-emb-multi": (_CASED.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
                          + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+",),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "laguna": (r"[^\n]+|[\n]+", _QWEN2),
    "exaone-moe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "minicpm5": (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
}
# llama.cpp's regex engine knows only the categories L, N, P, M and S (`unicode_regex_split`):
# there \p{Lu}, \p{Ll}, \p{Lt}, \p{Lm} and \p{Lo} each match every letter, so they are written
# as \p{L} here, or a case change inside a word ("CaseWords") would split where llama.cpp does not.
_LETTER_SUBCATEGORY = re.compile(r"\\p\{L[ultmo]\}")
PRE_REGEXES = {name: tuple(_LETTER_SUBCATEGORY.sub(r"\\p{L}", r.replace("CONTRACTIONS", _CONTRACTIONS[3:-1]))
                           for r in regexes)
               for name, regexes in PRE_REGEXES.items()}


@dataclass(frozen=True)
class PreTokenizer:
    regexes: str                 # key of PRE_REGEXES
    ignore_merges: bool = False  # a piece that is a whole token is that token, merges or not
    add_bos: bool = False        # llama.cpp's default when the file has no add_bos_token


_LLAMA3_NAMED = PreTokenizer("llama3", ignore_merges=True, add_bos=True)

# tokenizer.ggml.pre -> what llama.cpp makes of it. A file without the key gets "default", with
# llama.cpp's warning that generation quality will be degraded.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer("default"),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano"), _LLAMA3_NAMED),
    # the Llama 3 regex without Llama 3's whole-token lookup
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe"), PreTokenizer("llama3")),
    **dict.fromkeys(("glm4", "glm5"), PreTokenizer("llama3", ignore_merges=True)),
    "jais-2": PreTokenizer("jais2"),
    "deepseek-llm": PreTokenizer("deepseek-llm"),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), PreTokenizer("deepseek3")),
    "spark2_5": PreTokenizer("spark2_5"),
    "youtu": PreTokenizer("youtu", ignore_merges=True),
    "deepseek-coder": PreTokenizer("deepseek-coder"),
    "falcon": PreTokenizer("falcon"),
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
                    PreTokenizer("starcoder")),
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                     "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4", "mpt", "olmo",
                     "jais", "trillion", "granite-docling"), PreTokenizer("gpt2")),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
                     "solar-open", "grok-2"), PreTokenizer("qwen2")),
    "qwen35": PreTokenizer("qwen35"),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), PreTokenizer("bloom")),
    "viking": PreTokenizer("viking"),
    "tekken": PreTokenizer("tekken", ignore_merges=True, add_bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), PreTokenizer("gpt4o")),
    "granite-embed-multi-97m": PreTokenizer("granite-emb-multi", ignore_merges=True),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), PreTokenizer("bailingmoe")),
    "seed-coder": PreTokenizer("seed-coder"),
    "ufakzeka": PreTokenizer("ufakzeka"),
    "laguna": PreTokenizer("laguna"),
    "exaone-moe": PreTokenizer("exaone-moe"),
    "minicpm5": PreTokenizer("minicpm5", ignore_merges=True),
}
