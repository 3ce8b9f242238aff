/*
 * exec.h — commands as child processes (docs/protocol.md §3.3, docs/agent.md "Execution") and the
 * NDJSON frames their output becomes.
 *
 * A command is one process group led by the child the agent starts. Its stdout and stderr are
 * non-blocking pipes, its exit is a pidfd, its deadline a timer — all events on the agent's
 * one event_base. What happens to its output is up to a sink: the /v1/exec stream writes it to
 * the socket, a job keeps it for polls. The sink sees every kept chunk and exactly one ending.
 */
#ifndef SANDKIT_AGENT_EXEC_H
#define SANDKIT_AGENT_EXEC_H

#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct command;

enum { STREAM_STDOUT = 0, STREAM_STDERR = 1 };

enum outcome_kind { OUTCOME_EXIT, OUTCOME_ERROR };

/* How a command ended: an exit status, or a protocol error code with a message. */
struct outcome {
	enum outcome_kind kind;
	int code;           /* exit status; 128 + signal for a signal death */
	int signal;         /* the signal's number, 0 when the command exited by itself */
	int truncated;      /* output was dropped by the cap */
	int oom;            /* killed by the session's memory bound (limits.h) */
	const char *error;  /* timeoutExceeded, spawnFailed, ... (static) */
	char message[256];  /* bounded: it is copied into every poll of a finished job */
};

struct command_sink {
	/* A chunk of output that is kept; seq was assigned whether or not the chunk is kept. */
	void (*frame)(void *ctx, int stream, uint64_t seq, const unsigned char *data, size_t len);
	/* The one ending. The command has let go of the sink before this runs. */
	void (*end)(void *ctx, const struct outcome *o);
};

struct command_spec {
	char *const *argv;
	char *const *envp;
	int cwd_fd;         /* O_PATH directory to start in; -1 for the root */
	uint64_t timeout_ms;
	/* Bytes charged against the output cap for each kept frame on top of its data: a job pays
	 * its bookkeeping so that a million one-byte writes cannot outgrow the cap. */
	size_t frame_cost;
	/* Output kept per stream; 0: the agent's --output-cap (docs/protocol.md §6 outputCap). */
	uint64_t output_cap;
};

/*
 * Starts the command (see exec.c for how the child is made). Returns NULL and fills failure (spawnFailed) when it could not
 * be started; nothing is left running then.
 */
struct command *command_start(const struct command_spec *spec, const struct command_sink *sink,
			      void *ctx, struct outcome *failure);

/* Backpressure: stop and restart reading the pipes, so a full pipe blocks the command. */
void command_pause(struct command *c);
void command_resume(struct command *c);

/* Kills the command's group and forgets its sink, which is never called again. The agent
 * still reaps the process, then frees everything. */
void command_abandon(struct command *c);

/* Agent shutdown: SIGKILL every group and reap every leader; command_free_all then frees what
 * no sink released. */
void command_shutdown(void);
void command_free_all(void);

void outcome_error(struct outcome *o, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* {"t":"stdout","seq":N,"data":"<base64>"} without a newline. 0, or -1 when memory ran out. */
int frame_data(struct evbuffer *out, int stream, uint64_t seq, const unsigned char *data,
	       size_t len);
/* {"t":"exit",...} or {"t":"error",...} without a newline. */
int frame_terminal(struct evbuffer *out, const struct outcome *o);

#endif
