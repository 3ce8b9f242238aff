/*
 * agent.h — sandkit-agent's configuration, process-wide state and protocol limits
 * (docs/protocol.md §5). One agent serves one sandbox root from one libevent event_base.
 */
#ifndef SANDKIT_AGENT_H
#define SANDKIT_AGENT_H

#include "limits.h"
#include "log.h"

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct capability;

/* docs/protocol.md §5. */
#define AGENT_PROTOCOL_VERSION 1
/* Decoded bytes per data frame: one pipe read at most, so a frame never waits for more input. */
#define AGENT_FRAME_MAX 65536
/* Output kept per stream per command unless --output-cap says otherwise. */
#define AGENT_DEFAULT_OUTPUT_CAP (4u * 1024u * 1024u)
/* File size, either direction. */
#define AGENT_FILE_MAX ((size_t)32 * 1024 * 1024)
/* Request body: the base64 of the largest file plus 4 KiB of JSON around it (the encoding
 * rounded up to whole 4-character groups, as the encoder writes it). */
#define AGENT_BODY_MAX ((AGENT_FILE_MAX + 2) / 3 * 4 + 4096)
/* Jobs, running and retained together. */
#define AGENT_JOBS_MAX 16
/* The bearer token: 32 random bytes in standard base64 with padding. */
#define AGENT_TOKEN_BYTES 32
#define AGENT_TOKEN_CHARS 44
/* A UUID in its hyphenated text form, without the terminator. */
#define AGENT_UUID_CHARS 36

/* Exit statuses of a start that failed (docs/agent.md): a caller tells what the machine cannot
 * give from what was asked wrongly. */
#define AGENT_EXIT_START 2           /* a bad option, an unusable root, a port taken, ... */
#define AGENT_EXIT_NO_ISOLATION 3    /* --isolate bwrap: bubblewrap or user namespaces missing */
#define AGENT_EXIT_NO_NETWORK 4      /* --network outbound: no stack to attach */
#define AGENT_EXIT_NO_LIMITS 5       /* --memory, --pids, --cpus: no control group to bound them */

struct agent_config {
	char *root_path;            /* its canonical absolute path, for the log */
	int root_fd;                /* O_PATH descriptor every caller path is resolved beneath:
				     * under confinement the session's own / (confine.h) */
	char *listen_host;
	unsigned listen_port;
	char *listen_socket;        /* --listen unix:PATH: a Unix socket instead of host and port */
	int no_auth;
	char token[AGENT_TOKEN_CHARS + 1];
	struct capability *capability; /* non-NULL in capability mode (capability.h) */
	uint64_t output_cap;
	int require_activation;
	int ready_fd;               /* -1 when not asked */
	const char *ready_file;     /* NULL when not asked */
	const char *lifetime_file;  /* the session's end (lifetime.h); NULL: none */
	int isolate_bwrap;          /* commands run confined in the session (confine.h) */
	int network_outbound;       /* confined sessions reach out through a stack (network.h) */
	const char *bwrap_path;     /* bubblewrap */
	const char *init_path;      /* the session's init; NULL: beside the agent */
	const char *pasta_path, *slirp4netns_path;
	long long host_uid;         /* --host-uid; -1 when not given */
	const char *image_path;     /* --image: the session's / below its own changes; or NULL */
	const char *image_work_path;
	const char *disk_path;      /* --disk: the ext4 image the session's files live on; or NULL */
	int overlay_fuse;           /* --overlay fuse: fuse-overlayfs even where the kernel's serves */
	const char *fuse_overlayfs_path;
	struct limits_request limits;
	enum agent_log_level log_level;
	unsigned max_connections;   /* before the descriptor limit lowers it (http.h) */
	unsigned header_timeout_ms;
	unsigned body_timeout_ms;
	unsigned stall_timeout_ms;
	/* The descriptor limit the agent was started with; commands get it back, since the agent
	 * raises its own soft limit to the hard one. */
	unsigned long long nofile_soft;
};

struct agent {
	struct agent_config cfg;
	struct event_base *base;
	char boot_id[AGENT_UUID_CHARS + 1];
	int activated;
};

/* The one agent of this process: options are read once and the loop is single-threaded. */
extern struct agent agent;

#endif
