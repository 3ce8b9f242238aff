/*
 * unix_socket.h — the one bound on a Unix socket's path, for the agent that binds one and the
 * C core that connects to one.
 */
#ifndef SANDKIT_COMMON_UNIX_SOCKET_H
#define SANDKIT_COMMON_UNIX_SOCKET_H

#include <sys/un.h>

/* The longest path a Unix socket can be bound at or reached by: sun_path less its NUL (107
 * bytes on Linux). A longer one would be cut short by the kernel's address, not refused. */
#define SK_UNIX_SOCKET_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

#endif
