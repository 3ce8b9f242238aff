/*
 * regular_file.h — opening a configuration or secret file that someone names (a token file, a
 * kubeconfig, a CA bundle, a key), which must be a regular file: a FIFO there would hang the
 * open (and sandkit with it, past every deadline), a device could be read for ever, a socket or
 * a directory is a mistake to say as one. Plain C: sandkit-agent opens its --token-file with it,
 * and the core module's core.read_regular, which every such read in Lua goes through.
 */
#ifndef SANDKIT_REGULAR_FILE_H
#define SANDKIT_REGULAR_FILE_H

#include <stddef.h>

/*
 * Opens path for reading, refusing anything but a regular file before an open could block or
 * act on it: the path is looked at first (symbolic links followed, as mounted secrets are
 * links), then opened O_NONBLOCK and looked at again, so a file swapped in between is refused
 * too. Returns the descriptor (close-on-exec, blocking again), or -1 with why filled: "it is a
 * FIFO, not a regular file" and its like (errno 0), or the system's reason (its errno kept:
 * ENOENT for a file that is not there).
 */
int sk_open_regular(const char *path, char *why, size_t whylen);

#endif
