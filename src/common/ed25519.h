/*
 * ed25519.h — Ed25519 signatures (RFC 8032, the pure variant) over OpenSSL's libcrypto
 * (EVP_PKEY_ED25519). Plain C ABI, no Lua and no global state: the C core signs capability
 * tokens with it, sandkit-agent verifies them with it.
 *
 * A key is an opaque object holding either a private key (which can also verify) or only a
 * public one. Private keys come from PKCS#8 PEM, the form `openssl genpkey -algorithm ed25519`
 * writes; public keys from their raw 32 bytes, the form a key ring carries them in.
 */
#ifndef SANDKIT_ED25519_H
#define SANDKIT_ED25519_H

#include <stddef.h>

#define SK_ED25519_PUBLIC_BYTES 32
#define SK_ED25519_SIGNATURE_BYTES 64
/* An Ed25519 PKCS#8 PEM is 119 bytes; a file with comments or a trailing blank line stays far
 * below this, and anything longer is not one key. */
#define SK_ED25519_MAX_PEM ((size_t)16 * 1024)

typedef struct sk_ed25519_key sk_ed25519_key;

/* The private key in a PKCS#8 PEM text (len bytes, no terminator needed). An encrypted key is
 * refused rather than prompted for: nothing here may wait on a terminal. Returns NULL and fills
 * err (errlen bytes) when the text is not one unencrypted Ed25519 private key. */
sk_ed25519_key *sk_ed25519_private_from_pem(const char *pem, size_t len, char *err, size_t errlen);

/* A public key from its raw bytes; NULL when libcrypto refuses them or memory ran out. */
sk_ed25519_key *sk_ed25519_public_from_raw(const unsigned char raw[SK_ED25519_PUBLIC_BYTES]);

void sk_ed25519_free(sk_ed25519_key *k);

/* The raw public half of any key. Returns 0, or -1 when libcrypto fails. */
int sk_ed25519_public_raw(const sk_ed25519_key *k, unsigned char out[SK_ED25519_PUBLIC_BYTES]);

/* Signs msg with a private key. Returns 0, or -1 (a public-only key, or libcrypto failed). */
int sk_ed25519_sign(const sk_ed25519_key *k, const void *msg, size_t len,
		    unsigned char sig[SK_ED25519_SIGNATURE_BYTES]);

/* 1 when sig is a valid signature of msg under k, 0 otherwise (libcrypto failing included). */
int sk_ed25519_verify(const sk_ed25519_key *k, const void *msg, size_t len,
		      const unsigned char sig[SK_ED25519_SIGNATURE_BYTES]);

#endif
