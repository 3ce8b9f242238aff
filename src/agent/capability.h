/*
 * capability.h — the capability authorization mode (docs/protocol.md §2.1): a request carries
 * an Ed25519-signed token naming this agent's session, and the agent checks it against a ring
 * of trusted public keys before anything else happens.
 *
 *   token  = P "." S
 *   P      = base64url, no padding, of the claims JSON
 *   S      = base64url, no padding, of the Ed25519 signature over the ASCII bytes of P
 *   claims = {"sessionId":…, "operation":"execute", "generation":1, "expiresAt":<unix s>,
 *             "keyId":…}
 *
 * Checks, in this order, the signature first (under each key of the ring; nothing of P is read
 * before one verifies), then keyId names the key that verified, session, generation, expiry,
 * operation. The session is the pod's UID on Kubernetes, so a recreated pod refuses tokens
 * minted for the one before it.
 *
 * This file knows nothing of HTTP: the server hands it the values of the two headers that may
 * carry a token and answers with the status.
 */
#ifndef SANDKIT_AGENT_CAPABILITY_H
#define SANDKIT_AGENT_CAPABILITY_H

#include <stddef.h>

/* The header proxies leave alone: Kubernetes' API server proxy and agent-sandbox's router both
 * delete Authorization before forwarding. */
#define CAPABILITY_HEADER "X-Sandkit-Capability"
/* Room for the reason a 403 gives; the answer stays far below the client's error-body bound. */
#define CAPABILITY_WHY_MAX 160

struct capability;

/* The mode's configuration from --session-id and --public-keys ("kid:BASE64[,kid:BASE64…]",
 * each key the raw 32 bytes in standard padded base64). NULL with err filled when either does
 * not parse. */
struct capability *capability_new(const char *session_id, const char *public_keys, char *err,
				  size_t errlen);
void capability_free(struct capability *c);
size_t capability_key_count(const struct capability *c);

/*
 * Decides a request from its credential headers: `bearer` is the token of the Authorization
 * value (a span of bearer_len bytes; NULL when absent or not of the Bearer scheme, as the
 * server reads it with http_bearer) and authorization_count how many Authorization headers
 * came; `token` the X-Sandkit-Capability value, its length and its count.
 * X-Sandkit-Capability, when present, is the credential (an Authorization next to it belongs
 * to a proxy in front); else Authorization must be "Bearer <token>".
 * Returns 0 (allowed), 401 (no credential at all) or 403 (anything else), with why filled.
 */
int capability_authorize(const struct capability *c, const char *bearer, size_t bearer_len,
			 int authorization_count, const char *token, size_t token_len,
			 int token_count, char *why, size_t whylen);

#endif
