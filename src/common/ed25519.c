/* ed25519.c — see ed25519.h. */
#include "ed25519.h"

#include <stdio.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

struct sk_ed25519_key {
	EVP_PKEY *pkey;
	int private;
};

/* libcrypto asks for a passphrase through this; refusing makes an encrypted PEM fail at once
 * instead of prompting on whatever terminal the process has. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
	(void)buf;
	(void)size;
	(void)rwflag;
	(void)u;
	return -1;
}

static sk_ed25519_key *wrap(EVP_PKEY *pkey, int private)
{
	sk_ed25519_key *k = OPENSSL_zalloc(sizeof *k);
	if (k == NULL) {
		EVP_PKEY_free(pkey);
		return NULL;
	}
	k->pkey = pkey;
	k->private = private;
	return k;
}

sk_ed25519_key *sk_ed25519_private_from_pem(const char *pem, size_t len, char *err, size_t errlen)
{
	if (len > SK_ED25519_MAX_PEM) {
		snprintf(err, errlen, "the key is over %zu bytes: not one Ed25519 PEM key",
			 SK_ED25519_MAX_PEM);
		return NULL;
	}
	BIO *bio = BIO_new_mem_buf(pem, (int)len);
	if (bio == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	EVP_PKEY *pkey = PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL);
	BIO_free(bio);
	if (pkey == NULL) {
		/* The queue would otherwise be read later as the cause of someone else's failure
		 * (libcurl reports TLS errors from it). */
		ERR_clear_error();
		snprintf(err, errlen, "not an unencrypted PKCS#8 PEM private key");
		return NULL;
	}
	/* Any other algorithm would sign something no agent checks: refused by name. */
	if (EVP_PKEY_id(pkey) != EVP_PKEY_ED25519) {
		EVP_PKEY_free(pkey);
		snprintf(err, errlen, "the key is not an Ed25519 key");
		return NULL;
	}
	sk_ed25519_key *k = wrap(pkey, 1);
	if (k == NULL)
		snprintf(err, errlen, "out of memory");
	return k;
}

sk_ed25519_key *sk_ed25519_public_from_raw(const unsigned char raw[SK_ED25519_PUBLIC_BYTES])
{
	EVP_PKEY *pkey =
		EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, raw, SK_ED25519_PUBLIC_BYTES);
	if (pkey == NULL) {
		ERR_clear_error();
		return NULL;
	}
	return wrap(pkey, 0);
}

void sk_ed25519_free(sk_ed25519_key *k)
{
	if (k == NULL)
		return;
	EVP_PKEY_free(k->pkey);
	OPENSSL_free(k);
}

int sk_ed25519_public_raw(const sk_ed25519_key *k, unsigned char out[SK_ED25519_PUBLIC_BYTES])
{
	size_t n = SK_ED25519_PUBLIC_BYTES;
	if (EVP_PKEY_get_raw_public_key(k->pkey, out, &n) != 1 || n != SK_ED25519_PUBLIC_BYTES)
		return -1;
	return 0;
}

int sk_ed25519_sign(const sk_ed25519_key *k, const void *msg, size_t len,
		    unsigned char sig[SK_ED25519_SIGNATURE_BYTES])
{
	if (!k->private)
		return -1;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (ctx == NULL)
		return -1;
	size_t n = SK_ED25519_SIGNATURE_BYTES;
	/* Ed25519 hashes internally: no digest is named, and the message goes in one call. */
	int ok = EVP_DigestSignInit(ctx, NULL, NULL, NULL, k->pkey) == 1 &&
		 EVP_DigestSign(ctx, sig, &n, msg, len) == 1 && n == SK_ED25519_SIGNATURE_BYTES;
	EVP_MD_CTX_free(ctx);
	if (!ok)
		ERR_clear_error();
	return ok ? 0 : -1;
}

int sk_ed25519_verify(const sk_ed25519_key *k, const void *msg, size_t len,
		      const unsigned char sig[SK_ED25519_SIGNATURE_BYTES])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (ctx == NULL)
		return 0;
	int ok = EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, k->pkey) == 1 &&
		 EVP_DigestVerify(ctx, sig, SK_ED25519_SIGNATURE_BYTES, msg, len) == 1;
	EVP_MD_CTX_free(ctx);
	if (!ok)
		ERR_clear_error(); /* a forged signature is routine, not an error to keep */
	return ok;
}
