/*
 * archive_loader.c — the libarchive functions common/tarstream.c calls, forwarding to the
 * library archive_loader_load() opened (archive_loader.h says why it is not linked).
 *
 * Each forwarder is defined with the parameter list archive.h declares for it, so a library whose
 * headers changed a type fails the build here rather than a call at run time. The executable
 * exports none of them (it is not linked with -rdynamic), so libarchive's calls among its own
 * functions never come back here.
 */
#include "archive_loader.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <archive.h>
#include <archive_entry.h>

/* The library's name as the dynamic loader knows it (its soname, as Debian's libarchive13
 * installs it); a system whose libarchive has another builds with -DARCHIVE_LOADER_SONAME. */
#ifndef ARCHIVE_LOADER_SONAME
#define ARCHIVE_LOADER_SONAME "libarchive.so.13"
#endif

/* What a failed load said, to the size of a reply's text (handler.h REPLY_ERROR_MAX). */
#define ARCHIVE_LOADER_WHY_MAX 256
/* An error tarstream.c sets through archive_set_error, formatted here: its texts are a few
 * words ("the stream was abandoned"). */
#define ARCHIVE_LOADER_ERROR_MAX 256

/* The functions that return a value: (type, name, parameters, arguments). */
#define ARCHIVE_VALUE_FUNCTIONS(X) \
	X(struct archive_entry *, archive_entry_clear, (struct archive_entry *e), (e)) \
	X(__LA_MODE_T, archive_entry_filetype, (struct archive_entry *e), (e)) \
	X(const char *, archive_entry_hardlink, (struct archive_entry *e), (e)) \
	X(time_t, archive_entry_mtime, (struct archive_entry *e), (e)) \
	X(long, archive_entry_mtime_nsec, (struct archive_entry *e), (e)) \
	X(struct archive_entry *, archive_entry_new, (void), ()) \
	X(const char *, archive_entry_pathname, (struct archive_entry *e), (e)) \
	X(__LA_MODE_T, archive_entry_perm, (struct archive_entry *e), (e)) \
	X(la_int64_t, archive_entry_size, (struct archive_entry *e), (e)) \
	X(const char *, archive_entry_symlink, (struct archive_entry *e), (e)) \
	X(const char *, archive_error_string, (struct archive *a), (a)) \
	X(int, archive_read_data_block, \
	  (struct archive *a, const void **buff, size_t *size, la_int64_t *offset), \
	  (a, buff, size, offset)) \
	X(int, archive_read_free, (struct archive *a), (a)) \
	X(struct archive *, archive_read_new, (void), ()) \
	X(int, archive_read_next_header, (struct archive *a, struct archive_entry **e), (a, e)) \
	X(int, archive_read_open, \
	  (struct archive *a, void *data, archive_open_callback *open, archive_read_callback *read, \
	   archive_close_callback *close), \
	  (a, data, open, read, close)) \
	X(int, archive_read_support_format_tar, (struct archive *a), (a)) \
	X(int, archive_write_close, (struct archive *a), (a)) \
	X(la_ssize_t, archive_write_data, (struct archive *a, const void *p, size_t n), (a, p, n)) \
	X(int, archive_write_free, (struct archive *a), (a)) \
	X(int, archive_write_header, (struct archive *a, struct archive_entry *e), (a, e)) \
	X(struct archive *, archive_write_new, (void), ()) \
	X(int, archive_write_open, \
	  (struct archive *a, void *data, archive_open_callback *open, archive_write_callback *write, \
	   archive_close_callback *close), \
	  (a, data, open, write, close)) \
	X(int, archive_write_set_bytes_per_block, (struct archive *a, int bytes), (a, bytes)) \
	X(int, archive_write_set_format_pax_restricted, (struct archive *a), (a))

/* The functions that return nothing: (name, parameters, arguments). */
#define ARCHIVE_VOID_FUNCTIONS(X) \
	X(archive_entry_copy_pathname, (struct archive_entry *e, const char *s), (e, s)) \
	X(archive_entry_copy_symlink, (struct archive_entry *e, const char *s), (e, s)) \
	X(archive_entry_free, (struct archive_entry *e), (e)) \
	X(archive_entry_set_filetype, (struct archive_entry *e, unsigned int type), (e, type)) \
	X(archive_entry_set_mtime, (struct archive_entry *e, time_t s, long ns), (e, s, ns)) \
	X(archive_entry_set_perm, (struct archive_entry *e, __LA_MODE_T perm), (e, perm)) \
	X(archive_entry_set_size, (struct archive_entry *e, la_int64_t size), (e, size))

#define POINTER_VALUE(type, name, params, args) static type(*loaded_##name) params;
#define POINTER_VOID(name, params, args) static void(*loaded_##name) params;
ARCHIVE_VALUE_FUNCTIONS(POINTER_VALUE)
ARCHIVE_VOID_FUNCTIONS(POINTER_VOID)
static void (*loaded_archive_set_error)(struct archive *, int, const char *, ...);

#define FORWARD_VALUE(type, name, params, args) \
	type name params { return loaded_##name args; }
#define FORWARD_VOID(name, params, args) \
	void name params { loaded_##name args; }
ARCHIVE_VALUE_FUNCTIONS(FORWARD_VALUE)
ARCHIVE_VOID_FUNCTIONS(FORWARD_VOID)

/* Variadic: formatted here, passed on as one string. */
void archive_set_error(struct archive *a, int err, const char *fmt, ...)
{
	char text[ARCHIVE_LOADER_ERROR_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	loaded_archive_set_error(a, err, "%s", text);
}

static enum { NOT_TRIED, LOADED, FAILED } state = NOT_TRIED;
static char why_not[ARCHIVE_LOADER_WHY_MAX];

/* Sets *slot to the library's `name`; 0, or -1 with why_not saying which is missing. A
 * function pointer is the size of an object pointer wherever dlsym exists (POSIX). */
static int find(void *library, const char *name, void *slot, size_t size)
{
	void *symbol = dlsym(library, name);
	if (symbol == NULL) {
		snprintf(why_not, sizeof why_not, "%s has no %s", ARCHIVE_LOADER_SONAME, name);
		return -1;
	}
	memcpy(slot, &symbol, size);
	return 0;
}

const char *archive_loader_load(void)
{
	if (state == LOADED)
		return NULL;
	if (state == FAILED)
		return why_not;
	state = FAILED;
	void *library = dlopen(ARCHIVE_LOADER_SONAME, RTLD_NOW | RTLD_LOCAL);
	if (library == NULL) {
		const char *said = dlerror();
		snprintf(why_not, sizeof why_not, "cannot load %s: %s", ARCHIVE_LOADER_SONAME,
			 said ? said : "no reason given");
		return why_not;
	}
#define FIND_VALUE(type, name, params, args) \
	if (find(library, #name, &loaded_##name, sizeof loaded_##name) < 0) { \
		dlclose(library); \
		return why_not; \
	}
#define FIND_VOID(name, params, args) FIND_VALUE(void, name, params, args)
	ARCHIVE_VALUE_FUNCTIONS(FIND_VALUE)
	ARCHIVE_VOID_FUNCTIONS(FIND_VOID)
	FIND_VOID(archive_set_error, , )
	state = LOADED;
	return NULL;
}
