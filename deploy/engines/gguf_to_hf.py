#!/usr/bin/env python3
"""Convert a llama-architecture GGUF (e.g. SmolLM2-135M-Instruct Q4_1) into a
Hugging Face style folder that `mlx_lm.server --model DIR` loads:

    config.json  model.safetensors  tokenizer.json  tokenizer_config.json
    special_tokens_map.json  generation_config.json

Weights are dequantized to float32 (float16 runs ~2.7x slower on CPU MLX).
Everything is read from the GGUF's metadata; the output is byte-for-byte
deterministic (sorted JSON keys, fixed tensor order, no timestamps).

Only uses gguf (GGUFReader, gguf.quants.dequantize), numpy, safetensors and
tokenizers.

usage: gguf_to_hf.py MODEL.gguf OUT_DIR
"""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

# GGUF token types (llama.cpp's llama_token_type)
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def log(msg: str) -> None:
    print(f"[gguf_to_hf.py] {msg}", file=sys.stderr, flush=True)


def field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def required(reader: GGUFReader, key: str):
    v = field(reader, key)
    if v is None:
        raise SystemExit(f"GGUF has no {key}")
    return v


NAME_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_MAP = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")


def hf_name(name: str) -> str:
    if name in NAME_MAP:
        return NAME_MAP[name]
    m = BLOCK_RE.match(name)
    if m and m.group(2) in BLOCK_MAP:
        return f"model.layers.{m.group(1)}.{BLOCK_MAP[m.group(2)]}.weight"
    raise SystemExit(f"unsupported tensor {name!r}")


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert_hf_to_gguf row permutation of q/k."""
    out_dim, in_dim = w.shape
    return (
        w.reshape(n_head, out_dim // n_head // 2, 2, in_dim)
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def convert_weights(reader: GGUFReader, n_head: int, n_kv_head: int) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(list(t.shape)))
        if t.tensor_type == GGMLQuantizationType.F32:
            w = np.asarray(t.data, dtype=np.float32)
        else:
            w = dequantize(t.data, t.tensor_type)
        w = np.ascontiguousarray(w.reshape(shape), dtype=np.float32)
        if t.name.endswith(".attn_q.weight"):
            w = unpermute(w, n_head)
        elif t.name.endswith(".attn_k.weight"):
            w = unpermute(w, n_kv_head)
        tensors[hf_name(t.name)] = np.ascontiguousarray(w)
    return tensors


def build_tokenizer(reader: GGUFReader) -> tuple[Tokenizer, list[str], list[int]]:
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"only byte-level BPE (tokenizer.ggml.model=gpt2) is supported, got {model!r}")
    tokens: list[str] = list(required(reader, "tokenizer.ggml.tokens"))
    merges_raw: list[str] = list(required(reader, "tokenizer.ggml.merges"))
    types = list(field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))

    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in merges_raw]
    bpe = models.BPE(
        vocab=vocab,
        merges=merges,
        fuse_unk=False,
        byte_fallback=False,
    )
    tok = Tokenizer(bpe)
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)

    special_ids = [i for i, ty in enumerate(types) if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)]
    tok.add_special_tokens(
        [
            AddedToken(tokens[i], single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
            for i in special_ids
        ]
    )
    # Adding tokens already in the vocab must not grow it.
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise SystemExit("added special tokens changed the vocabulary size")
    return tok, tokens, special_ids


def dump_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, out = argv[1], argv[2]
    os.makedirs(out, exist_ok=True)
    log(f"reading {src}")
    r = GGUFReader(src)

    arch = required(r, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"only llama-architecture GGUFs are supported, got {arch!r}")
    A = arch + "."
    hidden = int(required(r, A + "embedding_length"))
    n_layers = int(required(r, A + "block_count"))
    n_head = int(required(r, A + "attention.head_count"))
    n_kv_head = int(field(r, A + "attention.head_count_kv", n_head))
    ffn = int(required(r, A + "feed_forward_length"))
    ctx = int(required(r, A + "context_length"))
    rope_theta = float(field(r, A + "rope.freq_base", 10000.0))
    # GGUF stores eps as float32 (1e-5 -> 9.99999974e-06); round-trip it through
    # float32's shortest repr so config.json says 1e-05 like the original.
    rms_eps = float(np.format_float_positional(np.float32(required(r, A + "attention.layer_norm_rms_epsilon")), trim="-"))
    head_dim = int(field(r, A + "rope.dimension_count", hidden // n_head))

    tok, tokens, special_ids = build_tokenizer(r)
    vocab_size = int(field(r, A + "vocab_size", len(tokens)))
    bos_id = field(r, "tokenizer.ggml.bos_token_id")
    eos_id = field(r, "tokenizer.ggml.eos_token_id")
    pad_id = field(r, "tokenizer.ggml.padding_token_id")
    unk_id = field(r, "tokenizer.ggml.unknown_token_id")
    add_bos = bool(field(r, "tokenizer.ggml.add_bos_token", False))
    chat_template = field(r, "tokenizer.chat_template")

    names = [t.name for t in r.tensors]
    tied = "output.weight" not in names

    log(f"dequantizing {len(names)} tensors to float32")
    weights = convert_weights(r, n_head, n_kv_head)
    emb = weights["model.embed_tokens.weight"]
    if emb.shape != (vocab_size, hidden):
        raise SystemExit(f"token_embd shape {emb.shape} != ({vocab_size}, {hidden})")

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "head_dim": head_dim,
        "intermediate_size": ffn,
        "max_position_embeddings": ctx,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": rms_eps,
        "vocab_size": vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "bos_token_id": None if bos_id is None else int(bos_id),
        "eos_token_id": None if eos_id is None else int(eos_id),
        "pad_token_id": None if pad_id is None else int(pad_id),
    }
    dump_json(os.path.join(out, "config.json"), config)

    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config[k] is not None}
    dump_json(os.path.join(out, "generation_config.json"), gen)

    log("writing model.safetensors")
    ordered = {k: weights[k] for k in sorted(weights)}
    save_file(ordered, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})

    log("writing tokenizer.json")
    tok_path = os.path.join(out, "tokenizer.json")
    tok.save(tok_path, pretty=True)  # vocab is serialised in id order: deterministic

    def tok_str(i):
        return None if i is None else tokens[int(i)]

    special_map = {
        k: v
        for k, v in (
            ("bos_token", tok_str(bos_id)),
            ("eos_token", tok_str(eos_id)),
            ("pad_token", tok_str(pad_id)),
            ("unk_token", tok_str(unk_id)),
        )
        if v is not None
    }
    special_map["additional_special_tokens"] = [tokens[i] for i in special_ids]
    dump_json(os.path.join(out, "special_tokens_map.json"), special_map)

    tok_cfg = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": ctx,
        "added_tokens_decoder": {
            str(i): {
                "content": tokens[i],
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i in special_ids
        },
        **special_map,
    }
    if chat_template is not None:
        tok_cfg["chat_template"] = chat_template
    dump_json(os.path.join(out, "tokenizer_config.json"), tok_cfg)
    log(f"done: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
