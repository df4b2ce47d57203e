/* The tokenizer of a GGUF model, with llama.cpp's semantics (release b10573, src/llama-vocab.cpp).
 *
 * Built from the model's metadata alone (tokenizer.ggml.*), so a worker that has only the floor
 * can tokenize. Two vocabulary kinds:
 *  - "llama": SentencePiece-style (SPM). The text has ' ' replaced by U+2581 and, when
 *    add_space_prefix (default true), a space prepended to each text fragment that follows the
 *    start or a special token. Adjacent symbols (UTF-8 characters) merge greedily by the score of
 *    the merged token, highest first, ties to the leftmost pair; a final symbol that is not a
 *    token falls back to its bytes as <0xXX> tokens (or to a one-byte token).
 *  - "gpt2": byte-level BPE with the default pre-tokenizer (the four splitting patterns llama.cpp
 *    uses when tokenizer.ggml.pre is absent or "default"), the GPT-2 byte-to-unicode map, and
 *    merges by rank (tokenizer.ggml.merges order), lowest first, ties to the leftmost pair.
 *    Code points are classified (letter/number/punctuation/space) by a table generated from the
 *    Unicode database (engine/unicode_class.py).
 * Special tokens (type CONTROL, USER_DEFINED, UNKNOWN) are split out of the text before the
 * vocabulary-specific step, longest text first; CONTROL and UNKNOWN ones only with parse_special.
 *
 * A struct wf_tokenizer owns copies of everything it needs: the model may be closed afterwards.
 * It is immutable after create and may be used from many threads at once. */
#ifndef WF_ENGINE_TOKENIZER_H
#define WF_ENGINE_TOKENIZER_H

#include "base/diag.h"
#include "model/kv.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WF_TOKEN_NULL (-1)

enum wf_tokenizer_kind {
	WF_TOKENIZER_SPM = 1, /* tokenizer.ggml.model "llama" */
	WF_TOKENIZER_BPE = 2, /* tokenizer.ggml.model "gpt2" */
};

/* GGUF tokenizer.ggml.token_type values. */
enum wf_token_type {
	WF_TOKEN_TYPE_UNDEFINED = 0,
	WF_TOKEN_TYPE_NORMAL = 1,
	WF_TOKEN_TYPE_UNKNOWN = 2,
	WF_TOKEN_TYPE_CONTROL = 3,
	WF_TOKEN_TYPE_USER_DEFINED = 4,
	WF_TOKEN_TYPE_UNUSED = 5,
	WF_TOKEN_TYPE_BYTE = 6,
};

struct wf_tokenizer;

/* Builds the tokenizer from GGUF metadata. Errors, with diag saying which key is at fault:
 * WF_ENOT_FOUND (no tokenizer.ggml.model or .tokens, or no .merges for gpt2), WF_EUNSUPPORTED
 * (another tokenizer model, or a gpt2 pre-tokenizer other than "default"), WF_EFORMAT (a key of
 * the wrong type, fewer scores or token types than tokens, a duplicate token text), WF_ELIMIT
 * (more than 2^24 tokens), -ENOMEM. Returns 0 and *ret_tok (free with wf_tokenizer_destroy). */
int wf_tokenizer_create(const struct wf_kv_set *kv, struct wf_tokenizer **ret_tok,
                        struct wf_diag *diag);
/* Accepts NULL. */
void wf_tokenizer_destroy(struct wf_tokenizer *tok);

enum wf_tokenizer_kind wf_tokenizer_kind(const struct wf_tokenizer *tok);
uint32_t wf_tokenizer_n_vocab(const struct wf_tokenizer *tok);
/* WF_TOKEN_NULL where the vocabulary has none. */
int32_t wf_tokenizer_bos(const struct wf_tokenizer *tok);
int32_t wf_tokenizer_eos(const struct wf_tokenizer *tok);
/* The token's text as stored in the vocabulary (with U+2581 or GPT-2 byte characters); NULL for
 * an id out of range. */
const char *wf_tokenizer_text(const struct wf_tokenizer *tok, int32_t id);

/* Tokenizes len bytes of text (any bytes: invalid UTF-8 is tokenized as llama.cpp does).
 * add_special: BOS first when the vocabulary says add_bos_token, EOS last when add_eos_token.
 * parse_special: CONTROL tokens written in the text ("<s>") become their ids.
 * Returns 0 with *ret_ids (malloc'ed, the caller frees; may be NULL when *ret_n is 0) and *ret_n;
 * WF_ENOT_FOUND when a byte has no fallback token (diag names it); -ENOMEM. Thread-safe. */
int wf_tokenizer_encode(const struct wf_tokenizer *tok, const char *text, size_t len,
                        bool add_special, bool parse_special, int32_t **ret_ids, size_t *ret_n,
                        struct wf_diag *diag);

/* The bytes one token stands for, llama.cpp's token_to_piece: CONTROL and UNKNOWN tokens give
 * their text only when special is true (else nothing); NORMAL tokens their text with U+2581 as
 * ' ' (SPM) or through the GPT-2 byte map (BPE); BYTE tokens their byte. Up to lstrip leading
 * spaces are dropped. Writes at most cap bytes to buf and returns the piece's full length (call
 * again with a larger buffer when it exceeds cap), or WF_EINVAL for an id out of range. */
int64_t wf_tokenizer_piece(const struct wf_tokenizer *tok, int32_t id, bool special, int lstrip,
                           char *buf, size_t cap);

/* llama.cpp's detokenize: the pieces concatenated; with add_space_prefix the first piece loses
 * one leading space, except after a leading BOS that remove_special drops (llama.cpp keeps the
 * space then); remove_special also drops a trailing EOS when add_eos_token. unparse_special:
 * CONTROL tokens as their text. BPE vocabularies also get llama.cpp's clean-up of spaces before
 * punctuation and contractions. Returns 0 with *ret_text (malloc'ed, NUL-terminated) and *ret_len;
 * WF_EINVAL for an id out of range; -ENOMEM. */
int wf_tokenizer_decode(const struct wf_tokenizer *tok, const int32_t *ids, size_t n,
                        bool remove_special, bool unparse_special, char **ret_text,
                        size_t *ret_len);

#ifdef __cplusplus
}
#endif
#endif
