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
	/* Optional, for a command with input: its input buffer has room again, or its input
	 * ended (closed, or the command stopped reading it). */
	void (*input_room)(void *ctx);
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
	/* Standard input: a pipe the agent writes (command_input), else /dev/null. */
	int stdin_pipe;
	/* A pseudo-terminal of cols x rows (both > 0) as standard input, output and error and as
	 * the controlling terminal of the command, which leads a session of its own; its output
	 * arrives as stdout. 0 x 0: none. */
	unsigned cols, rows;
};

/* Bytes of input a command holds that it has not read yet: what a writer is told there is room
 * for. The pipe's own EXEC_INPUT_PIPE comes on top; together they keep a fast writer busy while
 * a command that never reads costs the agent no more. */
#define EXEC_INPUT_MAX (256 * 1024)
/* The size asked of a command's input pipe (no terminal): 32 slots, twice Linux's default, so
 * that it covers the agent's turn between two writes when a writer's bytes go straight into
 * it (jobs_live.c). Bytes written fill a slot a page at a time (128 KiB); bytes spliced from a
 * socket take one slot per TCP fragment, 32 KiB at most: 1 MiB, the bound docs/agent.md gives.
 * A larger pipe measured little faster while its spliced bound grew with it. */
#define EXEC_INPUT_PIPE (128 * 1024)
/* The terminal's end-of-file character (VEOF, ^D): what closing a terminal's input sends. */
#define EXEC_PTY_EOF '\x04'

/*
 * Starts the command (see exec.c for how the child is made). Returns NULL and fills failure (spawnFailed) when it could not
 * be started; nothing is left running then.
 */
struct command *command_start(const struct command_spec *spec, const struct command_sink *sink,
			      void *ctx, struct outcome *failure);

/* Backpressure: stop and restart reading the pipes, so a full pipe blocks the command. */
void command_pause(struct command *c);
void command_resume(struct command *c);

/* Input. Room for more (0 once closed or when the command takes none); appending n bytes, any
 * n up to the room plus one body piece (the caller stops sending while there is none): 0, or
 * -1 when memory ran out; closing after what is buffered (a terminal gets its EOF character
 * instead: it stays the command's terminal). 1 while input may still be appended. */
size_t command_input_room(const struct command *c);
int command_input(struct command *c, const void *p, size_t n);
void command_input_close(struct command *c);
int command_input_open(const struct command *c);
/* The pipe a command without a terminal reads its input from while it is open, for a writer
 * that moves bytes into it itself (splice(2)), -1 otherwise; such a writer goes only once
 * command_input_held, the bytes appended and not yet written, is 0, so that its bytes follow
 * them. The command still owns the pipe and may close it at any time. */
int command_input_pipe(const struct command *c);
size_t command_input_held(const struct command *c);

/* A terminal's new size (TIOCSWINSZ: the command's foreground group gets SIGWINCH): 0, or -1
 * with errno (ENOTTY for a command without one). */
int command_resize(struct command *c, unsigned cols, unsigned rows);
/* Sends sig to the command's process group while its leader is unreaped: 0, or -1 with errno
 * (ESRCH once it was reaped). */
int command_signal(struct command *c, int sig);

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
