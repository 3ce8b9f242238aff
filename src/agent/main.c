/*
 * main.c — sandkit-agent: options, start-up and shutdown.
 *
 * The agent serves docs/protocol.md for one sandbox root: it binds, tells its caller the port on
 * --ready-fd/--ready-file, and runs one libevent loop until SIGTERM or SIGINT, which kill every
 * running command's process group before the agent exits 0.
 */
#include "agent.h"

#include "capability.h"
#include "common/base64.h"
#include "common/regular_file.h"
#include "common/unix_socket.h"
#include "confine.h"
#include "contain.h"
#include "exec.h"
#include "http.h"
#include "jobs.h"
#include "lifetime.h"
#include "log.h"
#include "network.h"
#include "preview.h"
#include "server.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/event.h>

/* A token file holds 44 characters and a newline; anything past this is not a token file. */
#define TOKEN_FILE_MAX 4096
/* The largest --output-cap: 16 jobs x 2 streams of it must still fit in a machine's memory. */
#define OUTPUT_CAP_MAX (1ULL << 30)
/* The largest --max-connections: past this the descriptor limit decides anyway. */
#define MAX_CONNECTIONS_MAX 1000000
/* --header-timeout bounds: a head needs some time; past ten minutes it is no deadline. */
#define HEADER_TIMEOUT_MIN_MS 10
#define HEADER_TIMEOUT_MAX_MS 600000
/* --body-timeout bounds: below, as the head's; above, an hour is room for the largest body on a
 * link of about 12 kB/s, and past it the deadline protects nothing. */
#define BODY_TIMEOUT_MIN_MS 10
#define BODY_TIMEOUT_MAX_MS 3600000
/* --stall-timeout bounds: as the body's; a reader paused for an hour is no reader. */
#define STALL_TIMEOUT_MIN_MS 10
#define STALL_TIMEOUT_MAX_MS 3600000
/* Freed heap the agent keeps for reuse rather than hand back to the kernel (see main). */
#define HEAP_KEEP (32 * 1024 * 1024)

struct agent agent;

/* The option list; its numbers are the constants the agent enforces (filled in from them). */
static void usage(FILE *out)
{
	fprintf(out,
		"usage: sandkit-agent --root DIR (--token-file FILE | --no-auth |\n"
		"                     --auth capability --session-id ID --public-keys KEYS) [options]\n"
		"\n"
		"Serves the sandbox agent protocol v1 (commands, jobs, files) for one sandbox root.\n"
		"Every option can also be set by the environment variable shown; a flag wins.\n"
		"\n"
		"  --root DIR             SANDKIT_AGENT_ROOT      the sandbox root (must exist); every\n"
		"                                                 caller path is resolved beneath it\n"
		"  --listen HOST:PORT     SANDKIT_AGENT_LISTEN    address to bind (default 127.0.0.1:0,\n"
		"                                                 port 0 = any free port; [v6]:PORT works),\n"
		"                                                 or unix:PATH, a Unix socket made there\n"
		"                                                 with mode 0600 (the ready line's port: 0)\n"
		"  --token-file FILE      SANDKIT_AGENT_TOKEN_FILE  bearer token: %d random bytes as %d\n"
		"                                                 characters of standard base64; never\n"
		"                                                 accepted on the command line\n"
		"  --no-auth              SANDKIT_AGENT_NO_AUTH=1 provider mode: a proxy in front\n"
		"                                                 authorizes; the agent checks nothing\n"
		"  --auth MODE            SANDKIT_AGENT_AUTH      bearer (with --token-file), none (as\n"
		"                                                 --no-auth) or capability: Ed25519-signed\n"
		"                                                 tokens for one session (docs/protocol.md)\n"
		"  --session-id ID        SANDKIT_AGENT_SESSION_ID  capability mode: the session tokens\n"
		"                                                 must name (on Kubernetes the pod's UID)\n"
		"  --public-keys KEYS     SANDKIT_AGENT_PUBLIC_KEYS  capability mode: the trusted keys,\n"
		"                                                 kid:BASE64[,kid:BASE64...], each the raw\n"
		"                                                 32-byte Ed25519 key in standard base64\n"
		"  --output-cap BYTES     SANDKIT_AGENT_OUTPUT_CAP  output kept per stream per command\n"
		"                                                 (default %llu, from 1 to %llu)\n"
		"  --max-connections N    SANDKIT_AGENT_MAX_CONNECTIONS  connections served at once\n"
		"                                                 (default %d; lowered to what the\n"
		"                                                 descriptor limit allows)\n"
		"  --header-timeout MS    SANDKIT_AGENT_HEADER_TIMEOUT  time for a request's line and\n"
		"                                                 headers, from its first byte (default\n"
		"                                                 %d, from %d to %d)\n"
		"  --body-timeout MS      SANDKIT_AGENT_BODY_TIMEOUT  time for a buffered request body as\n"
		"                                                 a whole, after its head (default %d,\n"
		"                                                 from %d to %d)\n"
		"  --stall-timeout MS     SANDKIT_AGENT_STALL_TIMEOUT  time a reply or a raw upload may\n"
		"                                                 make no progress (default %d, from %d\n"
		"                                                 to %d)\n"
		"  --require-activation   SANDKIT_AGENT_REQUIRE_ACTIVATION=1  answer 503 until the first\n"
		"                                                 authorized POST /v1/activate\n"
		"  --ready-fd N           SANDKIT_AGENT_READY_FD  after binding, write one line\n"
		"                                                 {\"port\":P,\"pid\":PID,\"bootId\":\"...\"}\n"
		"                                                 to fd N, then close it\n"
		"  --ready-file PATH      SANDKIT_AGENT_READY_FILE  the same line, written atomically\n"
		"  --isolate bwrap|none   SANDKIT_AGENT_ISOLATE   bwrap: commands run confined in one\n"
		"                                                 set of namespaces for the agent's life,\n"
		"                                                 the root as their /, as an unprivileged\n"
		"                                                 user (default none: on the host)\n"
		"  --network none|outbound  SANDKIT_AGENT_NETWORK  with bwrap: a loopback of the\n"
		"                                                 session's own only (default), or\n"
		"                                                 connections out through pasta or\n"
		"                                                 slirp4netns\n"
		"  --host-uid UID         SANDKIT_AGENT_HOST_UID  with bwrap, as root: the unprivileged\n"
		"                                                 host uid the sandbox user is (default\n"
		"                                                 the root's owner)\n"
		"  --bwrap PATH           SANDKIT_AGENT_BWRAP     bubblewrap (default /usr/bin/bwrap)\n"
		"  --init PATH            SANDKIT_AGENT_INIT      the session's init (default\n"
		"                                                 sandkit-init beside the agent)\n"
		"  --pasta PATH           SANDKIT_AGENT_PASTA     (default /usr/bin/pasta)\n"
		"  --slirp4netns PATH     SANDKIT_AGENT_SLIRP4NETNS  (default /usr/bin/slirp4netns)\n"
		"  --lifetime-file PATH   SANDKIT_AGENT_LIFETIME_FILE  the Unix time (seconds) the\n"
		"                                                 session ends at, as on SIGTERM; read\n"
		"                                                 at start and on every SIGHUP (empty:\n"
		"                                                 no end)\n"
		"  --memory BYTES         SANDKIT_AGENT_MEMORY    the memory the session's commands\n"
		"                                                 may use together (at least %llu)\n"
		"  --pids N               SANDKIT_AGENT_PIDS      their processes and threads together\n"
		"                                                 (at least %d)\n"
		"  --cpus CORES           SANDKIT_AGENT_CPUS      their CPU time, in cores (1.5: one\n"
		"                                                 and a half; at least 0.01)\n"
		"  --image DIR            SANDKIT_AGENT_IMAGE     with bwrap: the session's / is DIR\n"
		"                                                 seen copy-on-write, the root holding\n"
		"                                                 what the session changed (overlayfs)\n"
		"  --image-work DIR       SANDKIT_AGENT_IMAGE_WORK  overlayfs's work folder for --image,\n"
		"                                                 empty, on the root's filesystem\n"
		"  --overlay auto|fuse    SANDKIT_AGENT_OVERLAY   how --image is laid: overlayfs, or\n"
		"                                                 fuse-overlayfs where the kernel refuses\n"
		"                                                 it (auto, the default); fuse: always\n"
		"  --fuse-overlayfs PATH  SANDKIT_AGENT_FUSE_OVERLAYFS  (default /usr/bin/fuse-overlayfs)\n"
		"  --disk FILE            SANDKIT_AGENT_DISK      with bwrap, as root: the session's\n"
		"                                                 files (with --image, its changes) live\n"
		"                                                 on FILE, an ext4 image, and can take no\n"
		"                                                 more than it holds\n"
		"  --probe-limits                                 print which of memory, pids, cpu and\n"
		"                                                 disk this machine lets the agent bound,\n"
		"                                                 then exit\n"
		"  --log LEVEL            SANDKIT_AGENT_LOG       quiet, info (default) or debug, on stderr\n"
		"  --help                                         this text\n"
		"\n"
		"One way to authorize is required: --token-file, --no-auth or --auth capability. SIGTERM\n"
		"and SIGINT kill every running command's process group and what commands left behind,\n"
		"then the agent exits 0. A start that fails exits 2, or 3 when confinement cannot be\n"
		"had on this machine, or 4 when the outbound network cannot, or 5 when a limit cannot.\n",
		AGENT_TOKEN_BYTES, AGENT_TOKEN_CHARS, (unsigned long long)AGENT_DEFAULT_OUTPUT_CAP,
		(unsigned long long)OUTPUT_CAP_MAX, HTTP_DEFAULT_MAX_CONNECTIONS,
		HTTP_DEFAULT_HEADER_TIMEOUT_MS, HEADER_TIMEOUT_MIN_MS, HEADER_TIMEOUT_MAX_MS,
		HTTP_DEFAULT_BODY_TIMEOUT_MS, BODY_TIMEOUT_MIN_MS, BODY_TIMEOUT_MAX_MS,
		HTTP_DEFAULT_STALL_TIMEOUT_MS, STALL_TIMEOUT_MIN_MS, STALL_TIMEOUT_MAX_MS,
		(unsigned long long)LIMITS_MEMORY_MIN, LIMITS_PIDS_MIN);
}

static void vdie(int status, const char *fmt, va_list ap) __attribute__((noreturn));
static void vdie(int status, const char *fmt, va_list ap)
{
	fputs("sandkit-agent: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	exit(status);
}

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vdie(AGENT_EXIT_START, fmt, ap);
}

/* A start that failed for what the machine lacks, with its own exit status (agent.h). */
static void die_with(int status, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void die_with(int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vdie(status, fmt, ap);
}

struct raw_options {
	const char *root, *listen, *token_file, *no_auth, *output_cap, *require_activation;
	const char *ready_fd, *ready_file, *isolate, *log, *max_connections, *header_timeout;
	const char *body_timeout, *stall_timeout;
	const char *auth, *session_id, *public_keys;
	const char *network, *host_uid, *bwrap, *init, *pasta, *slirp4netns;
	const char *lifetime_file;
	const char *memory, *pids, *cpus, *image, *image_work, *disk, *overlay, *fuse_overlayfs;
};

static int env_flag(const char *name, const char *v)
{
	if (strcmp(v, "1") == 0 || strcmp(v, "true") == 0 || strcmp(v, "yes") == 0)
		return 1;
	if (strcmp(v, "0") == 0 || strcmp(v, "false") == 0 || strcmp(v, "no") == 0 || v[0] == '\0')
		return 0;
	die("%s must be 1 or 0, not '%s'", name, v);
}

/* The one reader of a number an option takes: decimal digits only, nothing around them (no
 * sign, space, hex prefix or exponent: "0x10" is no 16 here, as it is none to the sandkit
 * command), at most max. */
static uint64_t parse_u64(const char *what, const char *v, uint64_t max)
{
	char *end;
	errno = 0;
	unsigned long long n = strtoull(v, &end, 10);
	if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0 || n > max)
		die("%s must be a whole number of at most %llu, not '%s'", what,
		    (unsigned long long)max, v);
	return n;
}

static void parse_listen(const char *v)
{
	if (strncmp(v, "unix:", 5) == 0) {
		const char *path = v + 5;
		if (path[0] != '/' || strlen(path) > SK_UNIX_SOCKET_PATH_MAX)
			die("--listen unix:PATH takes an absolute path of at most %zu bytes, not '%s'",
			    SK_UNIX_SOCKET_PATH_MAX, path);
		agent.cfg.listen_socket = strdup(path);
		if (agent.cfg.listen_socket == NULL)
			die("out of memory");
		return;
	}
	const char *colon = strrchr(v, ':');
	if (colon == NULL || colon == v)
		die("--listen must be HOST:PORT, not '%s'", v);
	size_t hn = (size_t)(colon - v);
	if (v[0] == '[' && hn >= 2 && v[hn - 1] == ']') {
		v++;
		hn -= 2;
	}
	agent.cfg.listen_host = strndup(v, hn);
	if (agent.cfg.listen_host == NULL)
		die("out of memory");
	agent.cfg.listen_port = (unsigned)parse_u64("the --listen port", colon + 1, 65535);
}

static void read_token(const char *file)
{
	char why[128];
	int fd = sk_open_regular(file, why, sizeof why);
	if (fd < 0)
		die("cannot open the token file %s: %s", file, why);
	char buf[TOKEN_FILE_MAX + 1];
	size_t n = 0;
	for (;;) {
		ssize_t r = read(fd, buf + n, sizeof buf - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("cannot read the token file %s: %s", file, strerror(errno));
		if (r == 0 || (n += (size_t)r) == sizeof buf)
			break;
	}
	close(fd);
	if (n > TOKEN_FILE_MAX)
		die("the token file %s is not a token: it is over %d bytes", file, TOKEN_FILE_MAX);
	size_t s = 0, e = n;
	while (s < e && strchr(" \t\r\n", buf[s]) && buf[s])
		s++;
	while (e > s && strchr(" \t\r\n", buf[e - 1]) && buf[e - 1])
		e--;
	unsigned char raw[SK_B64_DECODED_MAX(AGENT_TOKEN_CHARS)];
	size_t rawlen;
	if (e - s != AGENT_TOKEN_CHARS || sk_b64_decode(buf + s, e - s, raw, &rawlen) < 0 ||
	    rawlen != AGENT_TOKEN_BYTES)
		die("the token file %s must hold %d random bytes as %d characters of standard base64",
		    file, AGENT_TOKEN_BYTES, AGENT_TOKEN_CHARS);
	memcpy(agent.cfg.token, buf + s, AGENT_TOKEN_CHARS);
	agent.cfg.token[AGENT_TOKEN_CHARS] = '\0';
	explicit_bzero(buf, sizeof buf);
	explicit_bzero(raw, sizeof raw);
}

/* Exactly one way to authorize: an agent that silently picked one would be a surprise. */
static void configure_auth(const struct raw_options *o, int no_auth)
{
	int capability = 0;
	if (o->auth) {
		if (strcmp(o->auth, "capability") == 0)
			capability = 1;
		else if (strcmp(o->auth, "none") == 0)
			no_auth = 1;
		else if (strcmp(o->auth, "bearer") != 0)
			die("--auth must be bearer, none or capability, not '%s'", o->auth);
		else if (o->token_file == NULL)
			die("--auth bearer needs --token-file");
	}
	int ways = capability + no_auth + (o->token_file != NULL);
	if (ways == 0)
		die("one of --token-file and --no-auth is required (or --auth capability)");
	if (ways > 1)
		die("--token-file, --no-auth and --auth capability exclude each other");
	/* Capability settings without capability mode would be silently ignored. */
	if (!capability && (o->session_id || o->public_keys))
		die("--session-id and --public-keys belong to --auth capability");
	agent.cfg.no_auth = no_auth;
	if (o->token_file)
		read_token(o->token_file);
	if (capability) {
		char err[256];
		agent.cfg.capability = capability_new(o->session_id, o->public_keys, err, sizeof err);
		if (agent.cfg.capability == NULL)
			die("%s", err);
	}
}

/* --isolate and what goes with it. Settings that mean something only under confinement are
 * refused without it rather than silently ignored. */
static void configure_confinement(const struct raw_options *o)
{
	struct agent_config *c = &agent.cfg;
	if (o->isolate && strcmp(o->isolate, "bwrap") == 0)
		c->isolate_bwrap = 1;
	else if (o->isolate && strcmp(o->isolate, "none") != 0 && o->isolate[0] != '\0')
		die("--isolate must be bwrap or none, not '%s'", o->isolate);
	if (o->network && strcmp(o->network, "outbound") == 0)
		c->network_outbound = 1;
	else if (o->network && strcmp(o->network, "none") != 0 && o->network[0] != '\0')
		die("--network must be none or outbound, not '%s'", o->network);
	/* Unconfined, commands use the host's network and uid as they are. */
	if (!c->isolate_bwrap && (c->network_outbound || o->host_uid))
		die("--network outbound and --host-uid need --isolate bwrap");
	c->host_uid = o->host_uid ? (long long)parse_u64("--host-uid", o->host_uid, UINT32_MAX - 1)
				  : -1;
	c->bwrap_path = o->bwrap ? o->bwrap : CONFINE_BWRAP;
	c->init_path = o->init;
	c->pasta_path = o->pasta ? o->pasta : NETWORK_PASTA;
	c->slirp4netns_path = o->slirp4netns ? o->slirp4netns : NETWORK_SLIRP4NETNS;
	if ((o->image != NULL) != (o->image_work != NULL))
		die("--image and --image-work go together");
	if (o->image && !c->isolate_bwrap)
		die("--image needs --isolate bwrap: unconfined commands see the host's /");
	c->image_path = o->image;
	c->image_work_path = o->image_work;
	/* The session's disk is mounted where its tree would be bound: only a confined session,
	 * built by an agent that may attach a loop device, has one. */
	if (o->disk && (!c->isolate_bwrap || geteuid() != 0))
		die("--disk needs --isolate bwrap and an agent run as root (it attaches a loop device)");
	c->disk_path = o->disk;
	if (o->overlay && strcmp(o->overlay, "fuse") == 0)
		c->overlay_fuse = 1;
	else if (o->overlay && strcmp(o->overlay, "auto") != 0 && o->overlay[0] != '\0')
		die("--overlay must be auto or fuse, not '%s'", o->overlay);
	c->fuse_overlayfs_path = o->fuse_overlayfs ? o->fuse_overlayfs : CONFINE_FUSE_OVERLAYFS;
	/* overlayfs takes its folders in one option string, separated by ',' and ':' and escaped
	 * with '\\': a path holding one would name other folders than it says. */
	const char *paths[] = { o->image, o->image_work };
	for (size_t i = 0; o->image && i < 2; i++)
		if (paths[i][0] != '/' || strpbrk(paths[i], ",:\\") || strlen(paths[i]) >= PATH_MAX)
			die("--image and --image-work must be absolute paths without ',', ':' or '\\', "
			    "not '%s'", paths[i]);
}

/* CORES as hundredths of a core: digits, then at most two decimals ("1.5", "0.25", "2"). */
static uint64_t parse_cores(const char *v)
{
	uint64_t whole = 0, centi = 0;
	const char *p = v;
	int digits = 0;
	for (; *p >= '0' && *p <= '9' && digits < 8; p++, digits++)
		whole = whole * 10 + (uint64_t)(*p - '0');
	int ok = digits > 0;
	if (ok && *p == '.') {
		p++;
		int places = 0;
		for (; *p >= '0' && *p <= '9' && places < 2; p++, places++)
			centi = centi * 10 + (uint64_t)(*p - '0');
		if (places == 0)
			ok = 0;
		else if (places == 1)
			centi *= 10;
	}
	uint64_t total = whole * 100 + centi;
	if (!ok || *p != '\0' || total < LIMITS_CPU_MIN_CENTI || total > LIMITS_CPU_MAX_CENTI)
		die("--cpus must be a number of cores from 0.01 to %d with at most two decimals, "
		    "not '%s'", LIMITS_CPU_MAX_CENTI / 100, v);
	return total;
}

/* --memory, --pids, --cpus: each a bound below which a shell cannot run is refused. */
static void configure_limits(const struct raw_options *o)
{
	struct limits_request *l = &agent.cfg.limits;
	if (o->memory) {
		l->memory = parse_u64("--memory", o->memory, LIMITS_MEMORY_MAX);
		if (l->memory < LIMITS_MEMORY_MIN)
			die("--memory must be at least %llu bytes: a shell needs that much to start",
			    (unsigned long long)LIMITS_MEMORY_MIN);
	}
	if (o->pids) {
		l->pids = parse_u64("--pids", o->pids, LIMITS_PIDS_MAX);
		if (l->pids < LIMITS_PIDS_MIN)
			die("--pids must be at least %d: a shell and its pipeline need that many",
			    LIMITS_PIDS_MIN);
	}
	if (o->cpus)
		l->cpu_centi = parse_cores(o->cpus);
}

static void configure(int argc, char **argv)
{
	struct raw_options o = {
		getenv("SANDKIT_AGENT_ROOT"), getenv("SANDKIT_AGENT_LISTEN"),
		getenv("SANDKIT_AGENT_TOKEN_FILE"), getenv("SANDKIT_AGENT_NO_AUTH"),
		getenv("SANDKIT_AGENT_OUTPUT_CAP"), getenv("SANDKIT_AGENT_REQUIRE_ACTIVATION"),
		getenv("SANDKIT_AGENT_READY_FD"), getenv("SANDKIT_AGENT_READY_FILE"),
		getenv("SANDKIT_AGENT_ISOLATE"), getenv("SANDKIT_AGENT_LOG"),
		getenv("SANDKIT_AGENT_MAX_CONNECTIONS"), getenv("SANDKIT_AGENT_HEADER_TIMEOUT"),
		getenv("SANDKIT_AGENT_BODY_TIMEOUT"), getenv("SANDKIT_AGENT_STALL_TIMEOUT"),
		getenv("SANDKIT_AGENT_AUTH"), getenv("SANDKIT_AGENT_SESSION_ID"),
		getenv("SANDKIT_AGENT_PUBLIC_KEYS"),
		getenv("SANDKIT_AGENT_NETWORK"), getenv("SANDKIT_AGENT_HOST_UID"),
		getenv("SANDKIT_AGENT_BWRAP"), getenv("SANDKIT_AGENT_INIT"),
		getenv("SANDKIT_AGENT_PASTA"), getenv("SANDKIT_AGENT_SLIRP4NETNS"),
		getenv("SANDKIT_AGENT_LIFETIME_FILE"),
		getenv("SANDKIT_AGENT_MEMORY"), getenv("SANDKIT_AGENT_PIDS"),
		getenv("SANDKIT_AGENT_CPUS"), getenv("SANDKIT_AGENT_IMAGE"),
		getenv("SANDKIT_AGENT_IMAGE_WORK"), getenv("SANDKIT_AGENT_DISK"),
		getenv("SANDKIT_AGENT_OVERLAY"), getenv("SANDKIT_AGENT_FUSE_OVERLAYFS"),
	};
	int no_auth = o.no_auth ? env_flag("SANDKIT_AGENT_NO_AUTH", o.no_auth) : 0;
	int require_activation = o.require_activation
		? env_flag("SANDKIT_AGENT_REQUIRE_ACTIVATION", o.require_activation) : 0;
	static const struct option longopts[] = {
		{ "root", required_argument, NULL, 'r' },
		{ "listen", required_argument, NULL, 'l' },
		{ "token-file", required_argument, NULL, 't' },
		{ "no-auth", no_argument, NULL, 'n' },
		{ "output-cap", required_argument, NULL, 'c' },
		{ "require-activation", no_argument, NULL, 'a' },
		{ "ready-fd", required_argument, NULL, 'f' },
		{ "ready-file", required_argument, NULL, 'F' },
		{ "isolate", required_argument, NULL, 'i' },
		{ "log", required_argument, NULL, 'L' },
		{ "max-connections", required_argument, NULL, 'm' },
		{ "header-timeout", required_argument, NULL, 'H' },
		{ "body-timeout", required_argument, NULL, 'B' },
		{ "stall-timeout", required_argument, NULL, 'S' },
		{ "auth", required_argument, NULL, 'A' },
		{ "session-id", required_argument, NULL, 's' },
		{ "public-keys", required_argument, NULL, 'k' },
		{ "network", required_argument, NULL, 'N' },
		{ "host-uid", required_argument, NULL, 'U' },
		{ "bwrap", required_argument, NULL, 'W' },
		{ "init", required_argument, NULL, 'I' },
		{ "pasta", required_argument, NULL, 'P' },
		{ "slirp4netns", required_argument, NULL, 'Z' },
		{ "lifetime-file", required_argument, NULL, 'T' },
		{ "memory", required_argument, NULL, 'M' },
		{ "pids", required_argument, NULL, 'p' },
		{ "cpus", required_argument, NULL, 'C' },
		{ "image", required_argument, NULL, 'g' },
		{ "image-work", required_argument, NULL, 'w' },
		{ "probe-limits", no_argument, NULL, 'q' },
		{ "disk", required_argument, NULL, 'D' },
		{ "overlay", required_argument, NULL, 'O' },
		{ "fuse-overlayfs", required_argument, NULL, 'X' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;
	while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (ch) {
		case 'r': o.root = optarg; break;
		case 'l': o.listen = optarg; break;
		case 't': o.token_file = optarg; break;
		case 'n': no_auth = 1; break;
		case 'c': o.output_cap = optarg; break;
		case 'a': require_activation = 1; break;
		case 'f': o.ready_fd = optarg; break;
		case 'F': o.ready_file = optarg; break;
		case 'i': o.isolate = optarg; break;
		case 'L': o.log = optarg; break;
		case 'm': o.max_connections = optarg; break;
		case 'H': o.header_timeout = optarg; break;
		case 'B': o.body_timeout = optarg; break;
		case 'S': o.stall_timeout = optarg; break;
		case 'A': o.auth = optarg; break;
		case 's': o.session_id = optarg; break;
		case 'k': o.public_keys = optarg; break;
		case 'N': o.network = optarg; break;
		case 'U': o.host_uid = optarg; break;
		case 'W': o.bwrap = optarg; break;
		case 'I': o.init = optarg; break;
		case 'P': o.pasta = optarg; break;
		case 'Z': o.slirp4netns = optarg; break;
		case 'T': o.lifetime_file = optarg; break;
		case 'M': o.memory = optarg; break;
		case 'p': o.pids = optarg; break;
		case 'C': o.cpus = optarg; break;
		case 'g': o.image = optarg; break;
		case 'w': o.image_work = optarg; break;
		case 'D': o.disk = optarg; break;
		case 'O': o.overlay = optarg; break;
		case 'X': o.fuse_overlayfs = optarg; break;
		case 'q': printf("%s\n", limits_probe()); exit(0);
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); exit(2);
		}
	}
	if (optind < argc)
		die("unexpected argument '%s' (see --help)", argv[optind]);

	struct agent_config *c = &agent.cfg;
	c->log_level = LOG_INFO;
	if (o.log) {
		if (strcmp(o.log, "quiet") == 0)
			c->log_level = LOG_QUIET;
		else if (strcmp(o.log, "info") == 0)
			c->log_level = LOG_INFO;
		else if (strcmp(o.log, "debug") == 0)
			c->log_level = LOG_DEBUG;
		else
			die("--log must be quiet, info or debug, not '%s'", o.log);
	}
	if (o.root == NULL || o.root[0] == '\0')
		die("--root is required (see --help)");
	c->root_fd = open(o.root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (c->root_fd < 0)
		die("the root %s cannot be used: %s", o.root, strerror(errno));
	c->root_path = realpath(o.root, NULL);
	if (c->image_path && c->root_path && strpbrk(c->root_path, ",:\\"))
		die("with --image the root's path must hold no ',', ':' or '\\', not '%s'", c->root_path);
	if (c->root_path == NULL)
		die("the root %s cannot be resolved: %s", o.root, strerror(errno));
	parse_listen(o.listen ? o.listen : "127.0.0.1:0");
	configure_auth(&o, no_auth);
	c->output_cap = o.output_cap ? parse_u64("--output-cap", o.output_cap, OUTPUT_CAP_MAX)
				     : AGENT_DEFAULT_OUTPUT_CAP;
	/* The cap also bounds what a job keeps for its polls, so "no cap" is not the agent's to
	 * grant; and 0 means "no cap" in an exec's outputCap, so it must not mean the opposite here. */
	if (c->output_cap == 0)
		die("--output-cap must be at least 1 byte (an exec asks for no cap with outputCap 0)");
	c->max_connections = o.max_connections
		? (unsigned)parse_u64("--max-connections", o.max_connections, MAX_CONNECTIONS_MAX)
		: HTTP_DEFAULT_MAX_CONNECTIONS;
	if (c->max_connections == 0)
		die("--max-connections must be at least 1");
	c->header_timeout_ms = o.header_timeout
		? (unsigned)parse_u64("--header-timeout", o.header_timeout, HEADER_TIMEOUT_MAX_MS)
		: HTTP_DEFAULT_HEADER_TIMEOUT_MS;
	if (c->header_timeout_ms < HEADER_TIMEOUT_MIN_MS)
		die("--header-timeout must be at least %d ms", HEADER_TIMEOUT_MIN_MS);
	c->body_timeout_ms = o.body_timeout
		? (unsigned)parse_u64("--body-timeout", o.body_timeout, BODY_TIMEOUT_MAX_MS)
		: HTTP_DEFAULT_BODY_TIMEOUT_MS;
	if (c->body_timeout_ms < BODY_TIMEOUT_MIN_MS)
		die("--body-timeout must be at least %d ms", BODY_TIMEOUT_MIN_MS);
	c->stall_timeout_ms = o.stall_timeout
		? (unsigned)parse_u64("--stall-timeout", o.stall_timeout, STALL_TIMEOUT_MAX_MS)
		: HTTP_DEFAULT_STALL_TIMEOUT_MS;
	if (c->stall_timeout_ms < STALL_TIMEOUT_MIN_MS)
		die("--stall-timeout must be at least %d ms", STALL_TIMEOUT_MIN_MS);
	c->require_activation = require_activation;
	c->ready_fd = -1;
	if (o.ready_fd) {
		c->ready_fd = (int)parse_u64("--ready-fd", o.ready_fd, INT_MAX);
		if (c->ready_fd <= 2 || fcntl(c->ready_fd, F_GETFD) < 0)
			die("--ready-fd %d is not an open descriptor above 2", c->ready_fd);
		/* It is the caller's: no command may inherit it, even before it is closed. */
		fcntl(c->ready_fd, F_SETFD, FD_CLOEXEC);
	}
	c->ready_file = o.ready_file;
	c->lifetime_file = o.lifetime_file && o.lifetime_file[0] ? o.lifetime_file : NULL;
	configure_confinement(&o);
	configure_limits(&o);
}

/* Writes all of buf; 0 or -1. */
static int write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t w = write(fd, buf, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		buf += w;
		len -= (size_t)w;
	}
	return 0;
}

static void announce(unsigned port)
{
	char line[128];
	int n = snprintf(line, sizeof line, "{\"port\":%u,\"pid\":%d,\"bootId\":\"%s\"}\n", port,
			 (int)getpid(), agent.boot_id);
	if (agent.cfg.ready_file) {
		/* Written beside the target and renamed: a reader sees no file or the whole line. */
		char tmp[PATH_MAX];
		if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", agent.cfg.ready_file, (int)getpid()) >=
		    (int)sizeof tmp)
			die("--ready-file is too long");
		int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
		if (fd < 0 || write_all(fd, line, (size_t)n) < 0 || close(fd) < 0 ||
		    rename(tmp, agent.cfg.ready_file) < 0) {
			int e = errno;
			unlink(tmp);
			die("cannot write --ready-file %s: %s", agent.cfg.ready_file, strerror(e));
		}
	}
	/* The descriptor last: a caller that reads the line there may rely on the file too. */
	if (agent.cfg.ready_fd >= 0) {
		if (write_all(agent.cfg.ready_fd, line, (size_t)n) < 0)
			die("cannot write the ready line to --ready-fd: %s", strerror(errno));
		close(agent.cfg.ready_fd);
		agent.cfg.ready_fd = -1;
	}
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	(void)what;
	(void)arg;
	log_info("signal %d: stopping", (int)sig);
	event_base_loopbreak(agent.base);
}

int main(int argc, char **argv)
{
	/* Descriptors 0-2 must be open, or a pipe made later could land on one and be taken for
	 * the agent's own stdout by a dup2 in a child. */
	for (int fd = 0; fd <= 2; fd++)
		if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd)
			return 2;
	configure(argc, argv);
	agent.activated = !agent.cfg.require_activation;
	if (util_uuid(agent.boot_id) < 0)
		die("cannot make a boot id: %s", strerror(errno));
	/* Before anything else is started: the session, or the namespace whose first child must
	 * be its keeper. */
	if (agent.cfg.isolate_bwrap) {
		char why[768];
		int status;
		if (confine_start(why, sizeof why, &status) < 0)
			die_with(status, "%s", why);
		log_info("%s", confine_description());
	} else {
		char uncontained[512];
		if (contain_start(uncontained, sizeof uncontained) < 0)
			log_info("%s: commands NOT contained, what they leave behind may outlive an "
				 "agent killed with SIGKILL", uncontained);
		else
			log_info("%s", contain_description());
	}
	{
		char why[PATH_MAX + 256];
		if (limits_start(&agent.cfg.limits, why, sizeof why) < 0) {
			confine_stop();
			contain_stop();
			die_with(AGENT_EXIT_NO_LIMITS, "%s", why);
		}
	}
	/* Every connection and every command's pipes take descriptors; the soft limit is often a
	 * fraction of the hard one, which the agent may take without asking. Commands get the
	 * original back (exec.c). */
	struct rlimit nofile;
	if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
		agent.cfg.nofile_soft = nofile.rlim_cur;
		nofile.rlim_cur = nofile.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &nofile) < 0)
			log_info("cannot raise the descriptor limit: %s", strerror(errno));
	}
	/* A caller that vanishes must not kill the agent with SIGPIPE mid-write, nor a file over a
	 * size limit with SIGXFSZ: the write fails with EFBIG instead, which is the caller's 413. */
	signal(SIGPIPE, SIG_IGN);
	signal(SIGXFSZ, SIG_IGN);
	/* Each output frame is a fresh 128 KiB buffer (libevent rounds the ~87 KB line up to a
	 * power of two), freed once the socket took it. At glibc's defaults each one is its own
	 * mmap, unmapped again on free, so every frame faulted all its pages in anew: most of a
	 * stream's CPU went there. The frames in flight still bound the memory in use; this only
	 * keeps freed frames in the heap for the next ones. */
	mallopt(M_MMAP_THRESHOLD, HEAP_KEEP);
	mallopt(M_TRIM_THRESHOLD, HEAP_KEEP);
	/* libevent's default clock, the coarse one: its precise one is a timerfd set again on every
	 * turn of the loop, a system call for each read or write a stream makes. A coarse timer can
	 * fire a tick early; the one deadline that must not, a command's, checks the precise clock
	 * (exec.c on_deadline). */
	agent.base = event_base_new();
	if (agent.base == NULL)
		die("cannot create the event loop");
	unsigned port;
	if (server_start(&port) < 0) {
		if (agent.cfg.listen_socket)
			die("cannot listen on unix:%s: %s", agent.cfg.listen_socket, strerror(errno));
		die("cannot listen on %s:%u: %s", agent.cfg.listen_host, agent.cfg.listen_port,
		    strerror(errno));
	}
	struct event *term = evsignal_new(agent.base, SIGTERM, on_signal, NULL);
	struct event *intr = evsignal_new(agent.base, SIGINT, on_signal, NULL);
	if (term == NULL || intr == NULL || event_add(term, NULL) < 0 || event_add(intr, NULL) < 0)
		die("cannot watch SIGTERM and SIGINT");
	char lifetime_why[512];
	if (lifetime_start(agent.cfg.lifetime_file, lifetime_why, sizeof lifetime_why) < 0)
		die("%s", lifetime_why);
	if (contain_watch() < 0 || confine_watch() < 0)
		die("cannot watch the process whose end ends the commands");
	/* Logged before the ready line, so whoever reads that line finds this one. */
	char where[SK_UNIX_SOCKET_PATH_MAX + 8];
	if (agent.cfg.listen_socket)
		snprintf(where, sizeof where, "unix:%s", agent.cfg.listen_socket);
	else
		snprintf(where, sizeof where, "port %u", port);
	log_info("serving %s on %s, at most %u connections (%s%s%s)", agent.cfg.root_path, where,
		 http_max_connections(),
		 agent.cfg.no_auth ? "no auth" : agent.cfg.capability ? "capability" : "bearer token",
		 agent.cfg.require_activation ? ", activation required" : "",
		 agent.cfg.isolate_bwrap ? ", bwrap" : "");
	announce(port);
	confine_settle();

	event_base_dispatch(agent.base);

	command_shutdown();
	/* Then what the commands left behind, in their own sessions included. */
	contain_stop();
	preview_close_all();
	confine_stop();
	limits_stop();
	server_stop();
	jobs_free_all();
	command_free_all();
	lifetime_stop();
	event_free(term);
	event_free(intr);
	event_base_free(agent.base);
	close(agent.cfg.root_fd);
	free(agent.cfg.root_path);
	free(agent.cfg.listen_host);
	free(agent.cfg.listen_socket);
	explicit_bzero(agent.cfg.token, sizeof agent.cfg.token);
	capability_free(agent.cfg.capability);
	return contain_lost() || confine_lost() ? 1 : 0;
}
