/* json_unique.c — see json_unique.h. */
#include "json_unique.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/*
 * The names of the objects still open, innermost last: an object's names are checked when it
 * closes and dropped then. Each name took at least four bytes of the text ("":0), so the list
 * never holds more than one entry per four bytes of the answer, and every answer the client
 * reads is bounded (docs/protocol.md §5); the decode that follows a passing check holds more
 * for the same members (a Lua string and a table slot each).
 */
struct names {
	sk_json_str *v;
	size_t count, cap;
};

/* The first list's room, in names: more than any object of the protocol has. */
#define NAMES_FIRST_CAP 32

static int add_name(struct names *n, const sk_json_str *name)
{
	if (n->count == n->cap) {
		size_t cap = n->cap ? n->cap * 2 : NAMES_FIRST_CAP;
		if (cap > SIZE_MAX / sizeof *n->v)
			return -1;
		sk_json_str *v = realloc(n->v, cap * sizeof *v);
		if (v == NULL)
			return -1;
		n->v = v;
		n->cap = cap;
	}
	n->v[n->count++] = *name;
	return 0;
}

static int by_value(const void *a, const void *b)
{
	return sk_json_str_cmp(a, b);
}

/* The later of two equal names among those from first on, or NULL; they are reordered. Sorted
 * rather than compared pairwise: an object of a million members must not cost a million
 * squared. The list is indexed only when it holds two names or more: an object with no names
 * may have no list at all (a null n->v, to which not even 0 may be added). */
static const sk_json_str *repeated(struct names *n, size_t first)
{
	size_t count = n->count - first;
	if (count < 2)
		return NULL;
	sk_json_str *v = n->v + first;
	qsort(v, count, sizeof *v, by_value);
	for (size_t i = 1; i < count; i++)
		if (sk_json_str_cmp(&v[i - 1], &v[i]) == 0)
			return v[i - 1].p > v[i].p ? &v[i - 1] : &v[i];
	return NULL;
}

enum sk_json_unique_result sk_json_unique(const char *text, size_t len, sk_json_unique_report *out)
{
	/*
	 * One entry per open container, so no recursion: the walk goes as deep as the reader lets
	 * it, and json.c refuses nesting past SK_JSON_MAX_DEPTH (the protocol's bodies are three
	 * levels deep; a deeper one is not an answer, and a text of a million '[' must cost
	 * neither stack nor memory).
	 */
	struct level {
		int object;
		size_t first; /* its first name in the list */
	} stack[SK_JSON_MAX_DEPTH];
	int top = 0;
	struct names names = { NULL, 0, 0 };
	enum sk_json_unique_result rc = SK_JSON_UNIQUE_OK;
	sk_json j;
	sk_json_init(&j, text, len);
	memset(out, 0, sizeof *out);

	for (;;) {
		/* One value: a container is entered, anything else read whole. */
		enum sk_json_kind kind = sk_json_peek(&j);
		if (kind == SK_JSON_OBJECT || kind == SK_JSON_ARRAY) {
			int r = kind == SK_JSON_OBJECT ? sk_json_object_begin(&j) : sk_json_array_begin(&j);
			if (r < 0 || top >= SK_JSON_MAX_DEPTH)
				goto unreadable;
			stack[top].object = kind == SK_JSON_OBJECT;
			stack[top].first = names.count;
			top++;
		} else if (sk_json_skip(&j) < 0) {
			goto unreadable;
		}
		/* Then the containers that close here, up to one with another element to read. */
		for (;;) {
			if (top == 0) {
				if (sk_json_finish(&j) < 0)
					goto unreadable;
				goto done;
			}
			struct level *l = &stack[top - 1];
			int r;
			if (l->object) {
				sk_json_str key;
				r = sk_json_object_key(&j, &key);
				if (r == 1) {
					if (add_name(&names, &key) < 0) {
						rc = SK_JSON_UNIQUE_NO_MEMORY;
						goto done;
					}
					break;
				}
				if (r == 0) {
					const sk_json_str *twice = repeated(&names, l->first);
					if (twice != NULL) {
						out->name = *twice;
						out->at = (size_t)(twice->p - 1 - text);
						rc = SK_JSON_UNIQUE_REPEATED;
						goto done;
					}
					names.count = l->first;
				}
			} else {
				r = sk_json_array_next(&j);
				if (r == 1)
					break;
			}
			if (r < 0)
				goto unreadable;
			top--;
		}
	}

unreadable:
	rc = SK_JSON_UNIQUE_UNREADABLE;
	out->err = j.err ? j.err : "nested too deeply";
	out->at = (size_t)(j.p - text);
done:
	free(names.v);
	return rc;
}
