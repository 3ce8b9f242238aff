/*
 * tree_remove.h — removal of a directory tree, shared by the C core (core.remove_tree: a
 * session's state folder) and sandkit-agent (a recursive fs removal, an extraction that failed).
 *
 * Bounded in descriptors and memory at any depth, deeper than any path can name included: a
 * tenant's commands can build such a tree, and a removal that recursed, kept one descriptor per
 * level or reopened directories by their paths would fail on it every time. The tree is
 * flattened as it goes: the top directory is drained entry by entry, and every directory found
 * one level below it is emptied by deleting its files and moving its subdirectories up into the
 * top one under fresh names (a rename within one filesystem never copies), then removed. Each
 * directory is opened once and moved at most once, so the work is linear in the tree's size.
 *
 * Every name is one component opened beneath a directory already held, without following a
 * symbolic link (a link is removed, never entered), so the removal never leaves the tree. A
 * directory a command left unreadable or read-only is made its owner's again (0700) before it
 * is cleared; root also takes back one another uid owns, where it may (without the capabilities
 * that override modes, as in an nginx worker or an agent working as a session's uid, it may
 * not, and the mode change then needs the owner). Plain C, no Lua.
 */
#ifndef SANDKIT_TREE_REMOVE_H
#define SANDKIT_TREE_REMOVE_H

#include <stddef.h>

/*
 * Removes name in dirfd (AT_FDCWD and a path in the C core) and everything beneath it; a file
 * or a link is simply unlinked. 0 (also when name is absent, or vanished meanwhile); or -1
 * with errno, and in stopped (stopped_size bytes, may be 0) the name of the entry the removal
 * could not get past. The directory holding name is left as it is: its modes are its owner's
 * business, not the removal's.
 */
int sk_tree_remove(int dirfd, const char *name, char *stopped, size_t stopped_size);

#endif
