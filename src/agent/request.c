/* request.c — see request.h. */
#include "request.h"

#include "keepalive.h"

#include "common/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growable NULL-terminated vector of strings; its size is bounded by the request body. */
struct strvec {
	char **v;
	size_t n, cap;
};

static int vec_push(struct strvec *s, char *str)
{
	if (s->n + 1 >= s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 8;
		char **v = realloc(s->v, cap * sizeof *v);
		if (v == NULL)
			return -1;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = str;
	s->v[s->n] = NULL;
	return 0;
}

static void vec_free(char **v)
{
	if (v == NULL)
		return;
	for (char **p = v; *p; p++)
		free(*p);
	free(v);
}

static void set_invalid(struct cmd_request *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_invalid(struct cmd_request *r, const char *fmt, ...)
{
	if (r->invalid)
		return; /* the first problem found is the one reported */
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->reason_buf, sizeof r->reason_buf, fmt, ap);
	va_end(ap);
	r->invalid = r->reason_buf;
}

/* The value of s as a NUL-terminated heap string; *len is its length, which is shorter than
 * strlen would say exactly when the value holds a NUL (\u0000). */
static char *dup_value(const sk_json_str *s, size_t *len)
{
	char *d = malloc(s->len + 1);
	if (d == NULL)
		return NULL;
	*len = sk_json_unescape(s, d);
	d[*len] = '\0';
	return d;
}

int request_job_id_valid(const char *s, size_t len)
{
	if (len < 1 || len > REQUEST_JOB_ID_MAX)
		return 0;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

static int cmp_env_key(const void *a, const void *b)
{
	const char *x = *(char *const *)a, *y = *(char *const *)b;
	size_t nx = strcspn(x, "="), ny = strcspn(y, "=");
	int c = memcmp(x, y, nx < ny ? nx : ny);
	return c ? c : (nx > ny) - (nx < ny);
}

/* Reads a timeout; *state becomes 1 for a usable integer, 2 for anything else. */
static int read_timeout(sk_json *j, uint64_t *out, int *state)
{
	if (sk_json_peek(j) == SK_JSON_NUMBER) {
		sk_json saved = *j; /* a fraction or an overflow fails the reader: rewind and skip */
		if (sk_json_u64(j, out) == 0) {
			*state = *out > 0 ? 1 : 2;
			return 0;
		}
		*j = saved;
	}
	*state = 2;
	return sk_json_skip(j);
}

static int read_command(sk_json *j, struct cmd_request *r, struct strvec *argv)
{
	if (sk_json_peek(j) != SK_JSON_ARRAY) {
		set_invalid(r, "command must be an array of strings");
		return sk_json_skip(j) < 0 ? -1 : 0;
	}
	if (sk_json_array_begin(j) < 0)
		return -1;
	/* An allocated vector, even an empty one, tells "empty" apart from "absent". */
	argv->v = malloc(8 * sizeof *argv->v);
	if (argv->v == NULL)
		return -2;
	argv->cap = 8;
	argv->v[0] = NULL;
	int more;
	while ((more = sk_json_array_next(j)) == 1) {
		sk_json_str s;
		if (sk_json_peek(j) != SK_JSON_STRING) {
			set_invalid(r, "command must be an array of strings");
			if (sk_json_skip(j) < 0)
				return -1;
			continue;
		}
		if (sk_json_string(j, &s) < 0)
			return -1;
		size_t n;
		char *arg = dup_value(&s, &n);
		if (arg == NULL || vec_push(argv, arg) < 0) {
			free(arg);
			return -2;
		}
		if (strlen(arg) != n)
			set_invalid(r, "command arguments must not contain NUL");
	}
	return more < 0 ? -1 : 0;
}

static int read_env(sk_json *j, struct cmd_request *r, struct strvec *env)
{
	if (sk_json_peek(j) == SK_JSON_NULL)
		return sk_json_null(j);
	if (sk_json_peek(j) != SK_JSON_OBJECT) {
		set_invalid(r, "env must be an object of strings");
		return sk_json_skip(j) < 0 ? -1 : 0;
	}
	if (sk_json_object_begin(j) < 0)
		return -1;
	int more;
	sk_json_str k;
	while ((more = sk_json_object_key(j, &k)) == 1) {
		sk_json_str v;
		if (sk_json_peek(j) != SK_JSON_STRING) {
			set_invalid(r, "env must be an object of strings");
			if (sk_json_skip(j) < 0)
				return -1;
			continue;
		}
		if (sk_json_string(j, &v) < 0)
			return -1;
		char *kv = malloc(k.len + v.len + 2);
		if (kv == NULL)
			return -2;
		size_t kn = sk_json_unescape(&k, kv);
		kv[kn] = '=';
		size_t vn = sk_json_unescape(&v, kv + kn + 1);
		kv[kn + 1 + vn] = '\0';
		if (vec_push(env, kv) < 0) {
			free(kv);
			return -2;
		}
		/* The kernel's environment is "K=V\0": an empty key, '=' in a key or NUL anywhere
		 * would change which variable the command sees. */
		if (kn == 0 || memchr(kv, '=', kn) != NULL)
			set_invalid(r, "environment variable names must be non-empty and free of '='");
		else if (memchr(kv, '\0', kn + 1 + vn) != NULL)
			set_invalid(r, "environment variables must not contain NUL");
	}
	if (more < 0)
		return -1;
	if (env->n > 1) {
		qsort(env->v, env->n, sizeof *env->v, cmp_env_key);
		for (size_t i = 1; i < env->n; i++)
			if (cmp_env_key(&env->v[i - 1], &env->v[i]) == 0)
				set_invalid(r, "env names a variable twice");
	}
	return 0;
}

static int read_cwd(sk_json *j, struct cmd_request *r, char **cwd, size_t *len)
{
	sk_json_str s;
	if (sk_json_peek(j) == SK_JSON_NULL)
		return sk_json_null(j);
	if (sk_json_peek(j) != SK_JSON_STRING) {
		set_invalid(r, "cwd must be a string");
		return sk_json_skip(j) < 0 ? -1 : 0;
	}
	if (sk_json_string(j, &s) < 0)
		return -1;
	free(*cwd);
	*cwd = dup_value(&s, len);
	return *cwd ? 0 : -2;
}

static int read_job_id(sk_json *j, struct cmd_request *r)
{
	sk_json_str s;
	if (sk_json_peek(j) == SK_JSON_NULL)
		return sk_json_null(j);
	if (sk_json_peek(j) != SK_JSON_STRING || sk_json_string(j, &s) < 0) {
		set_invalid(r, "jobId must be a string");
		return sk_json_skip(j) < 0 ? -1 : 0;
	}
	if (s.escaped || !request_job_id_valid(s.p, s.len)) {
		set_invalid(r, "jobId must be 1-%d characters of A-Z, a-z, 0-9, '_' and '-'",
			    REQUEST_JOB_ID_MAX);
		return 0;
	}
	memcpy(r->job_id, s.p, s.len);
	r->job_id[s.len] = '\0';
	return 0;
}

static int read_output_cap(sk_json *j, struct cmd_request *r)
{
	if (sk_json_peek(j) == SK_JSON_NUMBER) {
		sk_json saved = *j; /* a fraction, a sign or an overflow fails the reader: rewind */
		if (sk_json_u64(j, &r->output_cap) == 0) {
			r->has_output_cap = 1;
			return 0;
		}
		*j = saved;
	}
	set_invalid(r, "outputCap must be a non-negative integer");
	return sk_json_skip(j);
}

static int read_keepalive(sk_json *j, struct cmd_request *r)
{
	if (sk_json_peek(j) == SK_JSON_NUMBER) {
		sk_json saved = *j; /* a fraction, a sign or an overflow fails the reader: rewind */
		uint64_t ms;
		if (sk_json_u64(j, &ms) == 0 && ms >= KEEPALIVE_MIN_MS && ms <= KEEPALIVE_MAX_MS) {
			r->keepalive_ms = ms;
			return 0;
		}
		*j = saved;
	}
	set_invalid(r, "keepaliveMs must be an integer from %d to %d", KEEPALIVE_MIN_MS,
		    KEEPALIVE_MAX_MS);
	return sk_json_skip(j);
}

static int read_framing(sk_json *j, struct cmd_request *r)
{
	sk_json_str v;
	if (sk_json_peek(j) == SK_JSON_STRING) {
		sk_json saved = *j;
		if (sk_json_string(j, &v) == 0 && (sk_json_str_is(&v, "binary") || sk_json_str_is(&v, "ndjson"))) {
			r->framing = sk_json_str_is(&v, "binary") ? FRAMING_BINARY : FRAMING_NDJSON;
			return 0;
		}
		*j = saved;
	}
	set_invalid(r, "framing must be \"ndjson\" or \"binary\"");
	return sk_json_skip(j);
}


static int read_stdin(sk_json *j, struct cmd_request *r)
{
	if (sk_json_peek(j) == SK_JSON_TRUE || sk_json_peek(j) == SK_JSON_FALSE)
		return sk_json_bool(j, &r->stdin_pipe);
	set_invalid(r, "stdin must be true or false");
	return sk_json_skip(j);
}

/* One of a terminal's dimensions: 0 when it is not one in range. */
static unsigned read_dimension(sk_json *j)
{
	uint64_t v = 0;
	sk_json saved = *j; /* a fraction, a sign or an overflow fails the reader: rewind */
	if (sk_json_peek(j) == SK_JSON_NUMBER && sk_json_u64(j, &v) == 0)
		return v >= 1 && v <= REQUEST_PTY_MAX ? (unsigned)v : 0;
	*j = saved;
	sk_json_skip(j);
	return 0;
}

static int read_pty(sk_json *j, struct cmd_request *r)
{
	if (sk_json_peek(j) == SK_JSON_NULL)
		return sk_json_null(j);
	if (sk_json_peek(j) != SK_JSON_OBJECT || sk_json_object_begin(j) < 0) {
		set_invalid(r, "pty must be an object {cols, rows}");
		return sk_json_skip(j);
	}
	unsigned cols = 0, rows = 0;
	int seen_cols = 0, seen_rows = 0, more;
	sk_json_str k;
	while ((more = sk_json_object_key(j, &k)) == 1) {
		if (sk_json_str_is(&k, "cols") && !seen_cols) {
			seen_cols = 1;
			cols = read_dimension(j);
		} else if (sk_json_str_is(&k, "rows") && !seen_rows) {
			seen_rows = 1;
			rows = read_dimension(j);
		} else if (sk_json_skip(j) < 0) {
			return -1;
		}
	}
	if (more < 0)
		return -1;
	if (cols == 0 || rows == 0)
		set_invalid(r, "pty cols and rows must be integers from 1 to %d", REQUEST_PTY_MAX);
	r->cols = cols;
	r->rows = rows;
	return 0;
}

enum { F_COMMAND = 1, F_TIMEOUT = 2, F_DEADLINE = 4, F_CWD = 8, F_WORKDIR = 16, F_ENV = 32, F_JOB = 64,
       F_CAP = 128, F_KEEPALIVE = 256, F_FRAMING = 512, F_STDIN = 1024, F_PTY = 2048 };

int cmd_request_parse(const char *body, size_t len, struct cmd_request *r)
{
	memset(r, 0, sizeof *r);
	struct strvec argv = { 0 }, env = { 0 };
	char *cwd_new = NULL, *cwd_old = NULL;
	size_t cwd_new_len = 0, cwd_old_len = 0;
	uint64_t t_new = 0, t_old = 0;
	int t_new_state = 0, t_old_state = 0;
	unsigned seen = 0;
	int rc = 0;

	sk_json j;
	sk_json_init(&j, body, len);
	if (sk_json_object_begin(&j) < 0) {
		r->invalid = "the body is not a JSON object";
		rc = -1;
		goto out;
	}
	int more;
	sk_json_str key;
	while ((more = sk_json_object_key(&j, &key)) == 1) {
		unsigned bit = sk_json_str_is(&key, "command") ? F_COMMAND
			: sk_json_str_is(&key, "timeoutMs") ? F_TIMEOUT
			: sk_json_str_is(&key, "deadlineMs") ? F_DEADLINE
			: sk_json_str_is(&key, "cwd") ? F_CWD
			: sk_json_str_is(&key, "workingDirectory") ? F_WORKDIR
			: sk_json_str_is(&key, "env") ? F_ENV
			: sk_json_str_is(&key, "jobId") ? F_JOB
			: sk_json_str_is(&key, "outputCap") ? F_CAP
			: sk_json_str_is(&key, "keepaliveMs") ? F_KEEPALIVE
			: sk_json_str_is(&key, "framing") ? F_FRAMING
			: sk_json_str_is(&key, "stdin") ? F_STDIN
			: sk_json_str_is(&key, "pty") ? F_PTY : 0;
		int step;
		if (bit == 0 || (seen & bit)) {
			/* Unknown members are skipped like any JSON reader would; a repeated one is
			 * refused, because which copy wins differs between parsers. */
			if (bit)
				set_invalid(r, "a member appears twice");
			step = sk_json_skip(&j);
		} else {
			seen |= bit;
			switch (bit) {
			case F_COMMAND: step = read_command(&j, r, &argv); break;
			case F_TIMEOUT: step = read_timeout(&j, &t_new, &t_new_state); break;
			case F_DEADLINE: step = read_timeout(&j, &t_old, &t_old_state); break;
			case F_CWD: step = read_cwd(&j, r, &cwd_new, &cwd_new_len); break;
			case F_WORKDIR: step = read_cwd(&j, r, &cwd_old, &cwd_old_len); break;
			case F_ENV: step = read_env(&j, r, &env); break;
			case F_CAP: step = read_output_cap(&j, r); break;
			case F_KEEPALIVE: step = read_keepalive(&j, r); break;
			case F_FRAMING: step = read_framing(&j, r); break;
			case F_STDIN: step = read_stdin(&j, r); break;
			case F_PTY: step = read_pty(&j, r); break;
			default: step = read_job_id(&j, r); break;
			}
		}
		if (step == -2) {
			rc = -2;
			goto out;
		}
		if (step < 0)
			break;
	}
	if (j.err != NULL || sk_json_finish(&j) < 0) {
		snprintf(r->reason_buf, sizeof r->reason_buf, "the body is not valid JSON: %s",
			 j.err ? j.err : "malformed");
		r->invalid = r->reason_buf;
		rc = -1;
		goto out;
	}

	int t_state = t_new_state ? t_new_state : t_old_state;
	r->timeout_ms = t_new_state ? t_new : t_old;
	if (argv.v == NULL)
		set_invalid(r, "a command is required");
	else if (argv.n == 0)
		set_invalid(r, "a command must not be empty");
	if (t_state == 0)
		set_invalid(r, "timeoutMs is required");
	else if (t_state != 1)
		set_invalid(r, "timeoutMs must be an integer greater than zero");

	if (cwd_new) {
		r->cwd = cwd_new;
		r->cwd_len = cwd_new_len;
		cwd_new = NULL;
	} else if (cwd_old) {
		r->cwd = cwd_old;
		r->cwd_len = cwd_old_len;
		cwd_old = NULL;
	}

	/* The final environment: PATH unless the request brings its own, then the request's. */
	struct strvec envp = { 0 };
	int has_path = 0;
	for (size_t i = 0; i < env.n; i++)
		if (strncmp(env.v[i], "PATH=", 5) == 0)
			has_path = 1;
	if (!has_path) {
		char *path = strdup(REQUEST_DEFAULT_PATH);
		if (path == NULL || vec_push(&envp, path) < 0) {
			free(path);
			vec_free(envp.v);
			rc = -2;
			goto out;
		}
	}
	for (size_t i = 0; i < env.n; i++) {
		if (vec_push(&envp, env.v[i]) < 0) {
			vec_free(envp.v);
			rc = -2;
			goto out;
		}
		env.v[i] = NULL; /* moved */
	}
	r->envp = envp.v;
	r->argv = argv.v;
	argv.v = NULL;

out:
	if (env.v) {
		for (size_t i = 0; i < env.n; i++)
			free(env.v[i]);
		free(env.v);
	}
	vec_free(argv.v);
	free(cwd_new);
	free(cwd_old);
	return rc;
}

void cmd_request_free(struct cmd_request *r)
{
	vec_free(r->argv);
	vec_free(r->envp);
	free(r->cwd);
	r->argv = r->envp = NULL;
	r->cwd = NULL;
}
