/*
 * beneath.h — opening a path beneath a directory the way every hostile path is opened here:
 * openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS, so neither `..`,
 * an absolute path nor a symbolic link anywhere on the way leaves dirfd's tree. Plain C: the
 * agent's paths_open_at, the C core's tar streams and the tar fuzz target open through it.
 */
#ifndef SANDKIT_BENEATH_H
#define SANDKIT_BENEATH_H

#include <sys/types.h>

/*
 * Opens rel beneath dirfd with flags (O_CLOEXEC added; mode only with O_CREAT). The descriptor,
 * or -1 with errno: ELOOP for a link on the way, EXDEV for a way out, ENOSYS where the kernel
 * has no openat2, EAGAIN when renames kept racing the resolution past its retries.
 */
int sk_open_beneath(int dirfd, const char *rel, int flags, mode_t mode);

#endif
