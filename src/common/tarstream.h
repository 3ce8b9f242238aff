/*
 * tarstream.h — a directory as a tar stream, both ways, through libarchive (docs/protocol.md §6
 * fsTar): written as its reader pulls bytes (sk_tar), extracted as its writer pushes them
 * (sk_untar). Neither holds more than a piece of the stream (sk_untar gathers up to 64 KiB of it
 * before it extracts them), and neither waits on anything but the local filesystem, so an event
 * loop (sandkit-agent) or a Lua transfer (the C core) drives them a piece at a time.
 *
 * An archive to extract is hostile input. Every entry lands beneath the target directory or
 * the extraction fails, naming the entry:
 *   - its path is relative and never climbs ('/etc/x' and '../x' are refused), and is opened
 *     through the caller's confined open function (sk_open_fn), so no component may be a
 *     symbolic link, one the archive itself made a moment ago included;
 *   - regular files, directories, symbolic links (made, never followed) and hard links to an
 *     entry inside the target only; device nodes, FIFOs and sockets are refused;
 *   - a bound on entries and on the bytes they hold (their sizes as the headers say, so a
 *     sparse 1 TB header is refused before a byte is written);
 *   - the stream must end with tar's end-of-archive blocks: a stream cut anywhere, between two
 *     entries included, is truncated, never a smaller archive.
 * Each file is written under a temporary name beside its own and renamed into place once whole,
 * so a failure never leaves a short file under an entry's name. Modes (less set-user-ID and
 * set-group-ID) and modification times are kept, owners never; a directory's are set once the
 * archive has left it (depth-first order, as sk_tar and tar(1) write).
 *
 * A written archive holds the tree's directories, regular files and symbolic links (never
 * followed), in name order, as pax ("restricted": plain ustar unless a name or size needs more);
 * other kinds (devices, FIFOs, sockets) are left out, and a hard-linked file is written whole at
 * each of its names. A file that shrinks while it is read fails the archive, which must then be
 * cut short: its header promised bytes that are not there.
 */
#ifndef SANDKIT_TARSTREAM_H
#define SANDKIT_TARSTREAM_H

#include "walk.h"

#include <stddef.h>
#include <stdint.h>

/* An extraction's bounds unless the caller lowers them: room for a large source tree with its
 * dependencies, and far below what a hostile header can claim (10 million entries, a 1 TB
 * sparse file). */
#define SK_TAR_MAX_ENTRIES 1000000ULL
#define SK_TAR_MAX_BYTES (64ULL << 30)
/* Names a written archive's walk may hold at once (walk.h): a directory of about a million
 * entries. */
#define SK_TAR_NAMES_MAX ((size_t)32 << 20)
/* Bytes of a file read per piece of a written archive. */
#define SK_TAR_PIECE ((size_t)64 * 1024)

enum sk_tar_failure {
	SK_TAR_OK = 0,
	SK_TAR_REFUSED,    /* an entry the rules above refuse */
	SK_TAR_INVALID,    /* not a tar stream, or cut short */
	SK_TAR_TOO_LARGE,  /* over the entries or bytes bound */
	SK_TAR_ERRNO,      /* the filesystem refused an entry: sk_tar*_errno says what */
	SK_TAR_NO_MEMORY
};

typedef struct sk_untar sk_untar;

/* Extracts into targetfd (a directory; the caller keeps it open until sk_untar_free). NULL when
 * out of memory. */
sk_untar *sk_untar_new(int targetfd, sk_open_fn open_beneath, uint64_t max_entries,
		       uint64_t max_bytes);
/* The next piece of the stream, used (extracted, or copied to be with the next) before it
 * returns. 0, or -1 once the extraction failed (then and ever after; a failure in gathered bytes
 * shows at a later write or at sk_untar_finish). Bytes after the end-of-archive blocks are
 * ignored. */
int sk_untar_write(sk_untar *u, const void *p, size_t n);
/* The stream is over: 0 when it held a whole archive and every entry landed, else -1. */
int sk_untar_finish(sk_untar *u);
enum sk_tar_failure sk_untar_failure(const sk_untar *u);
int sk_untar_errno(const sk_untar *u);
/* What went wrong, in words ("entry '../x' climbs out of the target with '..'"). */
const char *sk_untar_error(const sk_untar *u);
/* The path of the entry it went wrong on, relative to the target; "" when none. */
const char *sk_untar_entry(const sk_untar *u);
uint64_t sk_untar_entries(const sk_untar *u);
uint64_t sk_untar_bytes(const sk_untar *u);
/* Stops an extraction (a cut stream) or releases a finished one; the file being written, if
 * any, is removed. */
void sk_untar_free(sk_untar *u);

typedef struct sk_tar sk_tar;

/* Archives what dirfd holds (the caller keeps it open until sk_tar_free), dirfd itself as the
 * entry ".". NULL when out of memory. */
sk_tar *sk_tar_new(int dirfd, sk_open_fn open_beneath);
/* Up to cap bytes of the archive into buf, as many as the archive has up to cap: how many
 * (> 0), 0 once it was all read, -1 when it failed (the stream must be cut short; what it
 * filled of buf before the failure is not handed out). */
long sk_tar_read(sk_tar *t, void *buf, size_t cap);
enum sk_tar_failure sk_tar_failure(const sk_tar *t);
int sk_tar_errno(const sk_tar *t);
const char *sk_tar_error(const sk_tar *t);
const char *sk_tar_entry(const sk_tar *t);
void sk_tar_free(sk_tar *t);

#endif
