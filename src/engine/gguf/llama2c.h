/*
 * llama2c: converts Karpathy's llama2.c checkpoints (model .bin + tokenizer .bin) to GGUF.
 *
 * Model file: 7 int32 {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len} (a negative
 * vocab_size means the classifier is stored separately), then float32 arrays: token embedding [vocab][dim],
 * rms_att [L][dim], wq [L][dim][dim], wk [L][kv_dim][dim], wv [L][kv_dim][dim], wo [L][dim][dim],
 * rms_ffn [L][dim], w1 [L][hidden][dim], w2 [L][dim][hidden], w3 [L][hidden][dim], rms_final [dim],
 * freq_cis_real/imag [seq_len][head_size/2] (ignored: RoPE is recomputed), then wcls [vocab][dim] if
 * unshared. Matrices are [out][in] row-major, which is GGUF's layout (ne0 = in). llama2.c rotates adjacent
 * pairs, which is the llama architecture's RoPE layout in GGUF, so no permutation is needed.
 * Tokenizer file: int32 max_token_length, then per token {float score, int32 len, bytes}.
 */
#ifndef WAFER_ENGINE_LLAMA2C_H
#define WAFER_ENGINE_LLAMA2C_H

/* Writes out_path. 0, or a negative error with a message naming the file and the problem (truncated file,
 * sizes that do not add up, vocab size mismatch). */
int llama2c_convert(const char *model_path, const char *tokenizer_path, const char *out_path, char *err);

#endif
