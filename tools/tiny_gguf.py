"""Writes the tiny GGUF model that `xpuctl ask`'s tests serve with llama.cpp's `llama-server`.

The model is a 1-block "llama" with random weights (f32, ~110 KB): it answers nonsense,
but through the real server, chat template, sampler and GBNF grammar code. Its vocabulary is
byte-level: the 256 GPT-2 byte tokens (no merges, so one token per byte: any text
tokenizes, and a grammar can make it produce any byte) plus three control tokens,
`<|endoftext|>` (BOS), `<|im_start|>` and `<|im_end|>` (EOS/EOT). The chat template is
ChatML. The trained context is 65536 tokens: with one token per byte, an ask's ~13 KB
prompt and the replies and diagnostics of four attempts fit.

Output bias. Llama has no output bias, so the model makes one: channel 0 of every token
embedding is a constant and no block writes to it, so after the final RMS norm it is a
near-constant positive value, and column 0 of the output matrix acts as a per-token logit
bias (BIAS_* below; the rest of the matrix adds small random noise). Printable ASCII, tab
and newline get 0; other bytes and the non-EOS control tokens a large negative bias (rare,
though a grammar can still force them); closing brackets, quotes and newlines a positive
one and opening brackets a negative one, so that nesting a grammar allows tends to close
(without it, a random walk into strings and brackets keeps some replies from ending for
thousands of tokens); EOS a small positive one, with no noise, so that replies end at about
the same rate whatever the seed. Measured with llama-server's default sampler, temperature
1, MiniLang's grammar and a 5 KB system prompt, 30 requests on each of seeds 0-2: every
reply could end (none hit 1000 tokens), median length 75-150 tokens, 55-90% within 200.
Short replies happen too (a few percent are empty: EOS first). Raising BIAS_EOS shortens
replies; below ~0 EOS drops out of the sampler's top-k 40 and replies get much longer.

    python3 tools/tiny_gguf.py OUT.gguf [--seed N]      (deterministic for a seed)
"""

import argparse

import numpy as np
from gguf import GGUFWriter, TokenType

N_EMBD, N_HEAD, N_FF, N_CTX = 32, 2, 64, 65536
EMBD_CONST = 4.0  # channel 0 of every embedding (the bias channel)
LOGIT_STD = 0.12  # std of the output matrix's other weights (logit noise ~0.55)
BIAS_OTHER_BYTE = -8.0  # bytes outside printable ASCII, \t and \n
BIAS_CONTROL = -10.0  # <|endoftext|>, <|im_start|>
BIAS_EOS = 0.25  # <|im_end|>
BIAS_CLOSE = 1.5  # )]}" and newline: nesting a grammar allows tends to close again
BIAS_OPEN = -1.0  # ([{

BOS, IM_START, EOS = 256, 257, 258
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def byte_tokens():
    """GPT-2's byte-to-unicode map: the token text of each byte 0..255."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write(path, seed):
    rng = np.random.default_rng(seed)
    tokens = byte_tokens() + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    n_vocab, head = len(tokens), N_EMBD // N_HEAD

    def rand(rows, cols, std):  # numpy shape (rows, cols) is ggml's {cols, rows}
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    bias = np.zeros(n_vocab, np.float32)
    for b in range(256):
        if not (0x20 <= b < 0x7F or b in (0x09, 0x0A)):
            bias[b] = BIAS_OTHER_BYTE
    bias[list(b')]}"\n')] = BIAS_CLOSE
    bias[list(b'([{')] = BIAS_OPEN
    bias[[BOS, IM_START]] = BIAS_CONTROL
    bias[EOS] = BIAS_EOS

    embd = rand(n_vocab, N_EMBD, 1.0)
    embd[:, 0] = EMBD_CONST
    # After the final norm, channel 0 is about EMBD_CONST / rms(x) with rms(x) ~ sqrt((C^2 + 31) / 32).
    h0 = EMBD_CONST / np.sqrt((EMBD_CONST**2 + N_EMBD - 1) / N_EMBD)
    output = rand(n_vocab, N_EMBD, LOGIT_STD)
    output[:, 0] = bias / h0
    output[EOS, 1:] = 0.0  # EOS's logit is its bias alone: the same stop rate whatever the seed
    wo, down = rand(N_EMBD, N_EMBD, 0.1), rand(N_EMBD, N_FF, 0.1)
    wo[0, :] = 0.0  # no block writes to the bias channel
    down[0, :] = 0.0

    w = GGUFWriter(path, "llama")
    w.add_name("tiny-byte-llama")
    w.add_file_type(0)  # all f32
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([TokenType.NORMAL] * 256 + [TokenType.CONTROL] * 3)
    # llama.cpp requires the merges key and gguf cannot write an empty array: one merge of
    # two control tokens, which never fires (BPE starts from single characters).
    w.add_token_merges(["<|im_start|> <|im_end|>"])
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_eot_token_id(EOS)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    ones = np.ones(N_EMBD, np.float32)
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", output)
    w.add_tensor("blk.0.attn_norm.weight", ones)
    w.add_tensor("blk.0.attn_q.weight", rand(N_HEAD * head, N_EMBD, 0.3))
    w.add_tensor("blk.0.attn_k.weight", rand(N_HEAD * head, N_EMBD, 0.3))
    w.add_tensor("blk.0.attn_v.weight", rand(N_HEAD * head, N_EMBD, 0.3))
    w.add_tensor("blk.0.attn_output.weight", wo)
    w.add_tensor("blk.0.ffn_norm.weight", ones)
    w.add_tensor("blk.0.ffn_gate.weight", rand(N_FF, N_EMBD, 0.3))
    w.add_tensor("blk.0.ffn_up.weight", rand(N_FF, N_EMBD, 0.3))
    w.add_tensor("blk.0.ffn_down.weight", down)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the .gguf file to write")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    write(args.out, args.seed)


if __name__ == "__main__":
    main()
