/*
 * sigv4.h — AWS Signature Version 4 for HTTP requests signed in headers, over OpenSSL's
 * libcrypto. Plain C ABI (no Lua), no allocation and no global state: the caller hands in a
 * workspace of sk_sigv4_workspace_size() bytes and every output points into it, so the Lua glue
 * can take it from the Lua allocator (nothing leaks if Lua raises) and an FFI binding can use
 * any buffer it likes.
 *
 * Why not libcurl's own signer (CURLOPT_AWS_SIGV4): on Debian 12's libcurl 7.88.1 it fails 6 of
 * the 38 header-signing cases of AWS's test suite (a repeated header is listed once per line in
 * SignedHeaders, the query string is neither decoded, re-encoded nor sorted, and "//" is not
 * normalized), it signs headers that a request removes ("Accept:", "Expect:") although they are
 * never sent, it sends X-Amz-Date twice when the caller sets it, and it never encodes the path a
 * second time as every service but S3 expects. docs/sigv4.md has the evidence.
 *
 * What is signed (https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html):
 *
 *   CanonicalRequest = method \n canonical URI \n canonical query \n canonical headers \n
 *                      \n signed headers \n payload hash
 *   StringToSign     = "AWS4-HMAC-SHA256" \n amz-date \n date/region/service/aws4_request \n
 *                      hex(SHA-256(CanonicalRequest))
 *   Signature        = hex(HMAC(HMAC(HMAC(HMAC(HMAC("AWS4" secret, date), region), service),
 *                      "aws4_request"), StringToSign))
 *
 * Every header the caller passes is signed, plus x-amz-date, plus x-amz-security-token when a
 * session token is given and x-amz-content-sha256 when asked for. The caller sends exactly the
 * headers it passed, with the values returned in sk_sigv4_result added.
 */
#ifndef SANDKIT_SIGV4_H
#define SANDKIT_SIGV4_H

#include <stddef.h>
#include <stdint.h>

/*
 * Limits. Everything a request carries is bounded so the workspace is too; the numbers are far
 * above what an AWS control-plane call needs (a handful of short headers, a path under 200
 * bytes) while keeping the worst-case workspace under a megabyte.
 */
#define SK_SIGV4_MAX_METHOD 32          /* bytes of the method, an HTTP token */
#define SK_SIGV4_MAX_PATH 8192          /* bytes of the path as given */
#define SK_SIGV4_MAX_QUERY 16384        /* bytes of a raw query string, or of all params together */
#define SK_SIGV4_MAX_PARAMS 256         /* query parameters */
#define SK_SIGV4_MAX_HEADERS 64         /* header lines (a repeated name counts once per line) */
#define SK_SIGV4_MAX_HEADER_NAME 128    /* bytes of one header name */
#define SK_SIGV4_MAX_HEADER_VALUE 8192  /* bytes of one header value */
#define SK_SIGV4_MAX_HEADER_BYTES 32768 /* bytes of all names and values together */
#define SK_SIGV4_MAX_SCOPE_PART 64      /* bytes of the region, and of the service */
#define SK_SIGV4_MAX_ACCESS_KEY 128     /* bytes of the access key id */
#define SK_SIGV4_MAX_SECRET_KEY 128     /* bytes of the secret access key */
#define SK_SIGV4_MAX_TOKEN 8192         /* bytes of a session token (STS tokens run to ~2 KiB) */
#define SK_SIGV4_MAX_PAYLOAD_HASH 128   /* bytes of a caller-supplied payload hash */
/* 9999-12-31T23:59:59Z: the date in the credential scope has four digits for the year. */
#define SK_SIGV4_MAX_TIME INT64_C(253402300799)

/* sk_sigv4_request.flags */
enum {
	/* URI-encode the path as given, so a '%' already in it becomes %25: what every service but
	 * S3 expects of a path sent encoded. Without it (S3) escapes already in the path are kept,
	 * with their hex digits upper-cased. */
	SK_SIGV4_DOUBLE_ENCODE_PATH = 1 << 0,
	/* Remove "." and ".." segments and empty segments ("//") from the path before encoding it,
	 * as every service but S3 does on its side. */
	SK_SIGV4_NORMALIZE_PATH = 1 << 1,
	/* Add and sign x-amz-content-sha256 with the payload hash (S3 requires it). */
	SK_SIGV4_CONTENT_SHA256_HEADER = 1 << 2,
	/* Send x-amz-security-token without signing it: the few services that add the token after
	 * signing (the suite's post-sts-header-after) need this; everything else signs it. */
	SK_SIGV4_UNSIGNED_SESSION_TOKEN = 1 << 3,
};

/* A name and a value, not NUL-terminated. */
typedef struct sk_sigv4_pair {
	const char *name;
	size_t name_len;
	const char *value;
	size_t value_len;
} sk_sigv4_pair;

typedef struct sk_sigv4_request {
	const char *method;
	size_t method_len;
	/* The path as it is sent, from its leading '/' up to any '?'. Bytes outside the URI grammar
	 * (a space, UTF-8) are accepted and encoded; control characters, '?' and '#' are refused. */
	const char *path;
	size_t path_len;
	/* The query as it is sent (no leading '?'), or NULL. Parameters are split on '&' and the
	 * first '=', decoded (%XX; a '+' is a plus sign, as SigV4 has it), re-encoded and sorted. */
	const char *query;
	size_t query_len;
	/* Or, instead of query, parameters as decoded names and values (not both). */
	const sk_sigv4_pair *params;
	size_t nparams;
	/* Header lines: names are HTTP tokens, values may not hold control characters other than
	 * tab. A name may repeat: the values are joined with ',' in the order given. Host is
	 * required; x-amz-date is refused (the signer sets it), and so are x-amz-security-token with
	 * a session token and x-amz-content-sha256 with SK_SIGV4_CONTENT_SHA256_HEADER. */
	const sk_sigv4_pair *headers;
	size_t nheaders;
	/* The payload hash to sign, e.g. "UNSIGNED-PAYLOAD"; or NULL to hash body/body_len. */
	const char *payload_hash;
	size_t payload_hash_len;
	const unsigned char *body;
	size_t body_len;
	const char *region;
	size_t region_len;
	const char *service;
	size_t service_len;
	const char *access_key;
	size_t access_key_len;
	const char *secret_key;
	size_t secret_key_len;
	const char *session_token; /* NULL for long-term credentials */
	size_t session_token_len;
	int64_t time;              /* seconds since the Unix epoch, 0 to SK_SIGV4_MAX_TIME */
	unsigned flags;            /* SK_SIGV4_* */
} sk_sigv4_request;

/* Outputs: NUL-terminated strings inside the workspace (or the request, for the token). */
typedef struct sk_sigv4_result {
	const char *canonical_request;
	size_t canonical_request_len;
	const char *canonical_query; /* a valid query string to send: what was signed */
	size_t canonical_query_len;
	const char *signed_headers;
	size_t signed_headers_len;
	const char *string_to_sign;
	size_t string_to_sign_len;
	const char *authorization;   /* the Authorization header's value */
	size_t authorization_len;
	const char *payload_hash;    /* x-amz-content-sha256's value when that flag is set */
	size_t payload_hash_len;
	char amz_date[17];           /* x-amz-date's value, YYYYMMDD'T'HHMMSS'Z' */
	char signature[65];
} sk_sigv4_result;

enum sk_sigv4_status {
	SK_SIGV4_OK = 0,
	SK_SIGV4_EMETHOD,       /* method empty, too long or not an HTTP token */
	SK_SIGV4_EPATH,         /* path not starting with '/', too long, or with a refused byte */
	SK_SIGV4_EQUERY,        /* query over its limits, a control character, or both forms given */
	SK_SIGV4_EHEADER_NAME,  /* a header name empty, too long or not an HTTP token */
	SK_SIGV4_EHEADER_VALUE, /* a header value too long or holding a control character */
	SK_SIGV4_EHEADERS,      /* too many headers, or too many bytes of them */
	SK_SIGV4_ENOHOST,       /* no host header */
	SK_SIGV4_ERESERVED,     /* a header the signer sets itself was passed in */
	SK_SIGV4_EPAYLOAD,      /* payload hash empty, too long or not [0-9A-Za-z-] */
	SK_SIGV4_ESCOPE,        /* region or service empty, too long or not [0-9A-Za-z._-] */
	SK_SIGV4_EACCESS_KEY,   /* access key empty, too long, or not printable ASCII without '/' */
	SK_SIGV4_ESECRET_KEY,   /* secret key empty or too long */
	SK_SIGV4_ETOKEN,        /* session token empty, too long, or not printable ASCII */
	SK_SIGV4_ETIME,         /* time before 1970 or after 9999 */
	SK_SIGV4_ENOSPACE,      /* the workspace is smaller than sk_sigv4_workspace_size() */
	SK_SIGV4_ECRYPTO        /* libcrypto failed */
};

/* A sentence naming the status; it never contains request data, so no credential. */
const char *sk_sigv4_strerror(int status);

/* Checks a request against the rules and limits above; SK_SIGV4_OK or the first failure. */
int sk_sigv4_check(const sk_sigv4_request *req);

/* Workspace bytes sk_sigv4_sign needs for a request that passed sk_sigv4_check. */
size_t sk_sigv4_workspace_size(const sk_sigv4_request *req);

/*
 * Signs req. Returns SK_SIGV4_OK with *out filled, its strings inside ws (valid while ws is),
 * or a status. Intermediate keys are wiped from the stack before returning.
 */
int sk_sigv4_sign(const sk_sigv4_request *req, char *ws, size_t ws_size, sk_sigv4_result *out);

/* Writes the lowercase hex SHA-256 of data and a NUL to out. Returns 0, or -1 if libcrypto
 * failed. */
int sk_sha256_hex(const void *data, size_t len, char out[65]);

#endif
