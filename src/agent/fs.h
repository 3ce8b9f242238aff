/*
 * fs.h — a session's files as a filesystem (docs/protocol.md §6, extensions fs, fsTar and
 * fsWatch): list, stat, remove and rename here (fs.c), a directory as a tar stream both ways
 * (fs_tar.c), and a watch (fs_watch.c). Every caller path goes through paths.h, beneath the
 * root descriptor; what the filesystem refuses is answered from the one errno table (fserror.h).
 */
#ifndef SANDKIT_AGENT_FS_H
#define SANDKIT_AGENT_FS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct http_request;

/* Entries one list page holds unless the caller asks for fewer (`limit`), and at most. */
#define FS_LIST_LIMIT_DEFAULT 1000
#define FS_LIST_LIMIT_MAX 10000
/* A page ends once its JSON passed this many bytes: an entry is at most ~50 KB (a name, a
 * path and a link target, every byte escaped), so a page stays under 1 MiB + 64 KiB; 10,000
 * entries of short names fit one. */
#define FS_LIST_PAGE_BYTES ((size_t)1 << 20)
/* A page is made whole before its first byte goes, and waits for its caller as the connection
 * drains. What pages wait for callers, all together, is bounded: a listing that would cross it
 * is refused 503 AGENT_BUSY (ask again), so callers that do not read hold 16 MiB at most. */
#define FS_LIST_IN_FLIGHT ((size_t)16 << 20)
/* Levels a list descends (`depth`): each holds one directory open while the page is made. */
#define FS_LIST_DEPTH_MAX 32
/* Names a recursive watch's walk holds at once (walk.h): a directory of about a million. */
#define FS_WALK_NAMES_MAX ((size_t)32 << 20)

/* GET /v1/fs/list?path=P[&depth=N][&limit=N][&cursor=C] */
void fs_list(struct http_request *req);
/* GET /v1/fs/stat?path=P */
void fs_stat(struct http_request *req);
/* POST /v1/fs/remove {"path": P, "recursive": bool} */
void fs_remove(struct http_request *req);
/* POST /v1/fs/rename {"from": P, "to": Q, "overwrite": bool} */
void fs_rename(struct http_request *req);
/* GET and PUT /v1/fs/tar?path=P (fs_tar.c) */
void fs_tar_get(struct http_request *req);
void fs_tar_put(struct http_request *req);
/* POST /v1/fs/watch (fs_watch.c) */
void fs_watch(struct http_request *req);

/* The paths.h resolver in walk.h's shape: beneath dirfd, never through a link. */
int fs_open_beneath(int dirfd, const char *rel, int flags, mode_t mode);

/* One member of a request body fs_read_body reads: a string (heap, NUL after *len bytes; the
 * caller frees it), a boolean or an unsigned integer. */
enum fs_member_type { FS_STRING, FS_BOOL, FS_UINT };
struct fs_member {
	const char *name;
	enum fs_member_type type;
	int required;
	char **str;
	size_t *len;
	int *flag;
	uint64_t *num;
};

/* Reads the JSON object body into the members (each at most once; others are ignored; at most
 * 8), through read_json_body. 0, or -1 once it answered 400 (or 500 when memory ran out).
 * Strings read are the caller's to free either way. */
int fs_read_body(struct http_request *req, const struct fs_member *members, size_t n);

/* The caller's path, normalized into rel (PATHS_MAX bytes); answers 400 PATH_REFUSED and
 * returns -1 when it is refused. */
int fs_normalize(struct http_request *req, const char *p, size_t len, char *rel);

/* What the caller sees as a path (a leading '/' then rel, "/" for the root) into out, which
 * holds PATHS_MAX + 1 bytes; its length. */
size_t fs_shown_path(const char *rel, char *out);

#endif
