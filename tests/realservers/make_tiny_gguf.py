#!/usr/bin/env python3
"""Generate a tiny random-weight llama-architecture GGUF model that llama.cpp's
llama-server can load.  No download needed: only numpy + the PyPI `gguf` package.

    pip install gguf==0.19.0
    python make_tiny_gguf.py tiny-llama.gguf

Model: llama arch, 2 layers, n_embd 64, 4 heads (head_dim 16), n_ff 128,
context 512, vocab 512 (SentencePiece-style "llama" vocab: <unk> <s> </s>,
256 byte-fallback tokens <0x00>..<0xFF>, printable ASCII chars, "▁"+words).
All tensors F32, random N(0, 0.02) weights, RMS-norm weights = 1.
File size ~0.5 MB.
"""
import string
import sys

import gguf
import numpy as np

N_VOCAB = 512
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 4
N_LAYER = 2
N_FF = 128
N_CTX = 512
HEAD_DIM = N_EMBD // N_HEAD

WORDS = (  # noqa: SIM905 - a word list reads better as text
    "the of and to in is you that it he was for on are as with his they at be this have from or "
    "one had by word but not what all were we when your can said there use an each which she do "
    "how their if will up other about out many then them these so some her would make like him "
    "into time has look two more write go see number no way could people my than first water "
    "been call who oil its now find long down day did get come made may part hello world gpu "
    "watch metric server token model llama cache queue request prompt decode test load"
).split()


def build_vocab():
    toks, scores, types = [], [], []

    def add(t, s, ty):
        toks.append(t)
        scores.append(float(s))
        types.append(int(ty))

    T = gguf.TokenType
    add("<unk>", 0.0, T.UNKNOWN)
    add("<s>", 0.0, T.CONTROL)
    add("</s>", 0.0, T.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, T.BYTE)
    # single characters (SPM pieces); "▁" is the SentencePiece space marker
    chars = ["\u2581"] + [c for c in string.ascii_letters + string.digits + string.punctuation]
    for i, c in enumerate(chars):
        add(c, -1000.0 - i, T.NORMAL)
    # "▁word" pieces and a few bare words; higher score = merged first
    seen = set(toks)
    i = 0
    for w in WORDS:
        for piece in ("\u2581" + w, w):
            if len(toks) >= N_VOCAB:
                break
            if piece in seen:
                continue
            seen.add(piece)
            add(piece, -float(i), T.NORMAL)
            i += 1
    # pad with 2-letter pieces so all intermediate merges exist
    for a in string.ascii_lowercase:
        for b in string.ascii_lowercase:
            if len(toks) >= N_VOCAB:
                break
            p = a + b
            if p in seen:
                continue
            seen.add(p)
            add(p, -500.0 - i, T.NORMAL)
            i += 1
    assert len(toks) == N_VOCAB, len(toks)
    return toks, scores, types


def main(path):
    rng = np.random.default_rng(1234)

    def rnd(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    w.add_name("gpuwatch-tiny-random-llama")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    toks, scores, types = build_vocab()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    # minimal ChatML template so /v1/chat/completions works too
    w.add_chat_template(
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content']"
        " + '<|im_end|>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

    # numpy shape is (rows, cols) == ggml ne reversed
    w.add_tensor("token_embd.weight", rnd(N_VOCAB, N_EMBD))
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", rnd(N_VOCAB, N_EMBD))
    kv = HEAD_DIM * N_HEAD_KV
    for b in range(N_LAYER):
        p = f"blk.{b}."
        w.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rnd(N_EMBD, N_EMBD))
        w.add_tensor(p + "attn_k.weight", rnd(kv, N_EMBD))
        w.add_tensor(p + "attn_v.weight", rnd(kv, N_EMBD))
        w.add_tensor(p + "attn_output.weight", rnd(N_EMBD, N_EMBD))
        w.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rnd(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", rnd(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", rnd(N_EMBD, N_FF))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama.gguf")
