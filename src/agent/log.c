/* log.c — see log.h. */
#include "log.h"

#include "agent.h"

#include <stdarg.h>
#include <stdio.h>

void log_at(enum agent_log_level level, const char *fmt, ...)
{
	if (agent.cfg.log_level < level)
		return;
	va_list ap;
	va_start(ap, fmt);
	fputs("sandkit-agent: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}
