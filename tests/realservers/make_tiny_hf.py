#!/usr/bin/env python3
"""Create a tiny random-weight Llama model + BPE tokenizer as a local HF model dir
(config.json, model.safetensors, tokenizer.json, ...).  No hub access needed:
the tokenizer is trained locally on a few sentences with the `tokenizers` lib.

    python make_tiny_hf.py /tmp/gw-engines/vllm/tiny-llama-hf

Model: LlamaForCausalLM, 2 layers, hidden 128, 2 heads (head_dim 64: vLLM CPU
attention rejects head_dim 16), ffn 256, ctx 512,
vocab 512 (byte-level BPE, 439 used).  ~0.5 M params, fp32 safetensors ~2 MB.
"""
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1] if len(sys.argv) > 1 else "tiny-llama-hf"
VOCAB = 512

corpus = [
    "hello world the gpu watch metric server token model llama cache queue request prompt "
    "decode test",
    "The quick brown fox jumps over the lazy dog. 0123456789 !?.,;:'\"()[]{}<>-_+=/\\|@#$%^&*~`",
    "vllm sglang triton llama.cpp inference engine prometheus metrics scrape load latency "
    "throughput",
] * 50

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>", "<pad>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
tok.train_from_iterator(corpus, trainer)

hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                 unk_token="<unk>", pad_token="<pad>", model_max_length=512)
hf_tok.chat_template = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
hf_tok.save_pretrained(out)

cfg = LlamaConfig(
    vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
    bos_token_id=hf_tok.bos_token_id, eos_token_id=hf_tok.eos_token_id,
    pad_token_id=hf_tok.pad_token_id, tie_word_embeddings=False, torch_dtype="float32",
)
torch.manual_seed(1234)
model = LlamaForCausalLM(cfg).to(torch.float32)
model.save_pretrained(out, safe_serialization=True)
print(f"wrote {out}: {sum(p.numel() for p in model.parameters())} params, vocab {len(hf_tok)}")
