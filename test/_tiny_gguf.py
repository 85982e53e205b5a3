"""A tiny llama-architecture GGUF model whose next-token distribution is known exactly.

No weights can be downloaded here, so the chat/decide tests build their model: one block, 64
wide, a SentencePiece-style vocabulary (``<unk> <s> </s>``, the 256 byte tokens, the ChatML
markers, printable ASCII). The weights are chosen, not trained, so the answer is known in
advance: every token embeds to the same vector ``c * e0``, attention and feed-forward weights
are zero (the residual stream is the embedding), and the final RMS norm keeps only dimension 0,
so the hidden state is ``sqrt(n_embd) * e0`` whatever the context and the logits are
``sqrt(n_embd) * output[:, 0]`` -- set to :data:`LOGITS` (every other token :data:`BASE_LOGIT`).

So P(token) = softmax(LOGITS) at every position: decide()'s label probabilities can be checked
against numbers computed here, and grammar-constrained generation (llama.cpp's function
calling) is deterministic under greedy decoding: an empty string, the digit 3, then the closing
brace; free text is a run of double quotes.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict

import numpy as np

N_EMBD = 64
N_HEAD = 4
N_FF = 128
N_CTX = 16384
BASE_LOGIT = -6.0
#: the logits the model gives these tokens at every position (the rest: BASE_LOGIT)
LOGITS: Dict[str, float] = {
    '"': 6.5,       # free text is a run of quotes; strings close at once
    "}": 5.5, ",": 5.2, "]": 5.0,
    "3": 4.0,       # the preferred digit
    "A": 3.0, "B": 2.0, "C": 1.0, "D": 0.0,   # decide()'s labels
    "</s>": 2.5,    # ends a grammar-constrained answer (the only token allowed then)
}

SPECIAL = ["<unk>", "<s>", "</s>"]
CHATML = ["<|im_start|>", "<|im_end|>"]
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 1, 2, 3, 6


def vocabulary() -> list:
    """``[(piece, type)]`` in id order."""
    vocab = [("<unk>", TOKEN_UNKNOWN), ("<s>", TOKEN_CONTROL), ("</s>", TOKEN_CONTROL)]
    vocab += [(f"<0x{b:02X}>", TOKEN_BYTE) for b in range(256)]
    vocab += [(t, TOKEN_CONTROL) for t in CHATML]
    vocab += [("\u2581", TOKEN_NORMAL)]
    vocab += [(chr(c), TOKEN_NORMAL) for c in range(33, 127)]
    return vocab


def label_probabilities(labels) -> list:
    """softmax over ``labels``' logits: what decide() must report after renormalising."""
    z = [math.exp(LOGITS.get(t, BASE_LOGIT)) for t in labels]
    return [v / sum(z) for v in z]


def label_mass(labels) -> float:
    """The probability mass of ``labels`` among all tokens (decide()'s ``coverage``)."""
    vocab = vocabulary()
    total = sum(math.exp(LOGITS.get(p, BASE_LOGIT)) for p, _ in vocab)
    return sum(math.exp(LOGITS.get(t, BASE_LOGIT)) for t in labels) / total


def build(path: Path) -> Path:
    """Write the model to ``path`` (a .gguf file) and return it."""
    import gguf

    vocab = vocabulary()
    ids = {p: i for i, (p, _) in enumerate(vocab)}
    n_vocab = len(vocab)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("sequence-ai-test-tiny")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list([p.encode("utf-8") for p, _ in vocab])
    w.add_token_scores([0.0 if t != TOKEN_NORMAL else -float(i) for i, (_, t) in enumerate(vocab)])
    w.add_token_types([t for _, t in vocab])
    w.add_bos_token_id(ids["<s>"])
    w.add_eos_token_id(ids["</s>"])
    w.add_unk_token_id(ids["<unk>"])
    w.add_add_bos_token(False)

    f32 = np.float32
    embd = np.zeros((n_vocab, N_EMBD), f32)
    embd[:, 0] = 1.0
    w.add_tensor("token_embd.weight", embd)
    zeros_sq = np.zeros((N_EMBD, N_EMBD), f32)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(N_EMBD, f32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"blk.0.{name}.weight", zeros_sq)
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(N_EMBD, f32))
    w.add_tensor("blk.0.ffn_gate.weight", np.zeros((N_FF, N_EMBD), f32))
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((N_FF, N_EMBD), f32))
    w.add_tensor("blk.0.ffn_down.weight", np.zeros((N_EMBD, N_FF), f32))
    norm = np.zeros(N_EMBD, f32)
    norm[0] = 1.0
    w.add_tensor("output_norm.weight", norm)
    out = np.zeros((n_vocab, N_EMBD), f32)
    scale = math.sqrt(N_EMBD)
    out[:, 0] = BASE_LOGIT / scale
    for piece, logit in LOGITS.items():
        out[ids[piece], 0] = logit / scale
    w.add_tensor("output.weight", out)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
