/*
 * log.h — diagnostics on stderr, filtered by --log. Never the place for a token or a file's
 * contents: callers log what happened, not what was carried.
 */
#ifndef SANDKIT_AGENT_LOG_H
#define SANDKIT_AGENT_LOG_H

#if defined(__GNUC__)
#define AGENT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define AGENT_PRINTF(a, b)
#endif

enum agent_log_level { LOG_QUIET = 0, LOG_INFO = 1, LOG_DEBUG = 2 };

/* Writes when --log (agent.cfg.log_level) asks for level or more. */
void log_at(enum agent_log_level level, const char *fmt, ...) AGENT_PRINTF(2, 3);

#define log_info(...) log_at(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_DEBUG, __VA_ARGS__)

#endif
